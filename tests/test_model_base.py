"""One model base: every bundled model kind (encoder, language model, vision, translator, speech)
goes through `BaseModel`'s checks, with the same messages, and reports its info the same way."""
from __future__ import annotations

import functools
import re

import numpy as np
import pytest
import torch

import attnviz
from attnviz.core import base_model, model, seq2seq, speech_model, transformer, translator, translation_parts

KEYS = ("minilm", "smollm2", "e5-small", "dinov2", "en-pt", "whisper-tiny-en")
TEXT_KEYS = ("minilm", "smollm2", "e5-small", "en-pt")     # the kinds that read text and token ids
TONE = (0.1 * np.sin(2 * np.pi * 440 * np.arange(16_000) / 16_000)).astype(np.float32)   # 1 s at 440 Hz


@functools.lru_cache(maxsize=None)
def loaded(key: str):
    return attnviz.load_model(key)


def run(m, head_mask=None, x=None):
    """Each kind's own entry, the way its page calls it."""
    if isinstance(m, attnviz.SpeechModel):
        return m.transcribe(TONE if x is None else x, head_mask=head_mask, max_tokens=2)
    if isinstance(m, attnviz.Seq2SeqModel):
        return m.translate("Hello." if x is None else x, head_mask=head_mask, max_tokens=2)
    if m.cfg.is_vision:
        return m.trace(torch.zeros(3, 28, 28) if x is None else x, head_mask=head_mask)
    return m.trace("Hello." if x is None else x, head_mask=head_mask)


def mask_name(m) -> str:
    return "head_mask (cross-attention)" if isinstance(m, attnviz.Seq2SeqModel) else "head_mask"


def raises_exactly(message: str):
    return pytest.raises(ValueError, match=f"^{re.escape(message)}$")


# ---------------------------------------------------------------- the public classes
def test_the_public_classes_come_from_attnviz():
    assert attnviz.BaseModel is base_model.BaseModel and attnviz.ModelInfo is base_model.ModelInfo
    assert attnviz.Model is model.Model and attnviz.Trace is model.Trace
    assert attnviz.Seq2SeqModel is translator.Seq2SeqModel and attnviz.Translation is translation_parts.Translation
    assert attnviz.SpeechModel is speech_model.SpeechModel and attnviz.Transcript is speech_model.Transcript
    for cls in (attnviz.Model, attnviz.Seq2SeqModel, attnviz.SpeechModel):
        assert issubclass(cls, attnviz.BaseModel)
    assert {"BaseModel", "Model", "Seq2SeqModel", "SpeechModel", "ModelInfo", "Trace", "Translation",
            "Transcript"} <= set(attnviz.__all__)


@pytest.mark.parametrize("key", KEYS)
def test_every_kind_is_a_base_model_with_info_and_fingerprint(key):
    m = loaded(key)
    assert isinstance(m, attnviz.BaseModel)
    info = m.info
    assert isinstance(info, attnviz.ModelInfo) and info.key == key and info.family == m.cfg.family
    # the one constructor gives back exactly the info the loader built
    assert type(m).describe(key, m.cfg, info.source, m.net, licence=info.licence, size_mb=info.size_mb) == info
    layers = (m.cfg.n_enc_layers + m.cfg.n_dec_layers) if isinstance(m, attnviz.Seq2SeqModel) else m.cfg.n_layers
    assert (info.n_layers, info.n_heads) == (layers, m.cfg.n_heads)
    assert info.params == sum(p.numel() for p in m.net.parameters()) > 0
    assert m.num_params() == sum(p.numel() for part in m.parts() if part is not None for p in part.parameters())
    before = m.fingerprint()
    assert re.fullmatch(r"[0-9a-f]{64}", before)
    run(m, torch.zeros(m.mask_layers, m.cfg.n_heads))    # every head off: the shared weights stay as they were
    assert m.fingerprint() == before


# ---------------------------------------------------------------- head masks
@pytest.mark.parametrize("key", KEYS)
def test_a_head_mask_of_the_wrong_shape_gets_one_message(key):
    m = loaded(key)
    want = [m.mask_layers, m.cfg.n_heads]
    with raises_exactly(f"{mask_name(m)} must have shape {want} (layers x heads); got [1, 1]"):
        run(m, torch.ones(1, 1))
    with raises_exactly(f"{mask_name(m)} must be a float tensor of shape {want} (layers x heads)"):
        run(m, "all heads")


@pytest.mark.parametrize("key", KEYS)
def test_trace_is_every_kinds_common_entry_with_the_mask_second(key):
    m = loaded(key)
    x = TONE if isinstance(m, attnviz.SpeechModel) else torch.zeros(3, 28, 28) if key == "dinov2" else "Hello."
    want = [m.mask_layers, m.cfg.n_heads]
    with raises_exactly(f"{mask_name(m)} must have shape {want} (layers x heads); got [1, 1]"):
        m.trace(x, torch.ones(1, 1))


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("value", [float("nan"), 2.0, -0.5])
def test_a_head_mask_outside_zero_to_one_gets_one_message(key, value):
    m = loaded(key)
    bad = torch.ones(m.mask_layers, m.cfg.n_heads)
    bad[0, 0] = value
    with raises_exactly(f"{mask_name(m)} values must lie in [0, 1] (1 keeps a head, 0 removes it)"):
        run(m, bad)


def test_the_translator_checks_its_other_masks_the_same_way():
    m = loaded("en-pt")
    c = m.cfg
    with raises_exactly(f"encoder_head_mask must have shape [{c.n_enc_layers}, {c.n_heads}] "
                        "(layers x heads); got [1, 1]"):
        m.translate("Hello.", encoder_head_mask=torch.ones(1, 1))


def test_the_speech_model_traces_through_the_same_checks():
    m = loaded("whisper-tiny-en")
    want = [m.cfg.n_dec_layers, m.cfg.n_heads]
    with raises_exactly(f"{mask_name(m)} must have shape {want} (layers x heads); got [1, 1]"):
        m.trace(TONE, head_mask=torch.ones(1, 1))
    with pytest.raises(ValueError, match="transcribes speech"):
        m.translate("Hello.")


# ---------------------------------------------------------------- ids and text
@pytest.mark.parametrize("key", TEXT_KEYS)
def test_bad_token_ids_get_one_set_of_messages(key):
    m = loaded(key)
    what = "source" if isinstance(m, attnviz.Seq2SeqModel) else "input"
    vocab = m.cfg.vocab_size
    with raises_exactly(f"{what} token ids must lie in [0, {vocab})"):
        run(m, x=[1, vocab])
    with raises_exactly(f"{what} token ids must lie in [0, {vocab})"):
        run(m, x=[-1])
    with raises_exactly(f"the {what} has no token ids; give at least one"):
        run(m, x=[])
    for bad in ([0.5, 1.0], [[1, 2]], [True], torch.tensor([[1, 2]]), {1: 2}, [2 ** 70]):
        with raises_exactly(f"the {what} must be text or a 1-D list (or LongTensor) of integer token ids"):
            run(m, x=bad)


def test_a_translator_checks_its_target_ids_the_same_way():
    m = loaded("en-pt")
    with raises_exactly(f"target token ids must lie in [0, {m.cfg.vocab_size})"):
        m.trace("Hello.", target=[-3])
    with raises_exactly("the target has no token ids; give at least one"):
        m.trace("Hello.", target=[])
    with raises_exactly("the text is empty; type or paste a sentence"):
        m.trace("Hello.", target="  ")


@pytest.mark.parametrize("key", TEXT_KEYS)
def test_empty_long_and_broken_text_get_one_set_of_messages(key, set_limits):
    m = loaded(key)
    for empty in ("", "   ", "\n\t"):
        with raises_exactly("the text is empty; type or paste a sentence"):
            run(m, x=empty)
    with pytest.raises(ValueError, match=r"^the text holds an invalid character \(a lone surrogate, U\+D83D"):
        run(m, x="cut emoji \ud83d here")
    set_limits(max_text_chars=10)
    with raises_exactly("the text has 12 characters; the limit is 10. Paste a shorter passage."):
        run(m, x="Hello there!")


@pytest.mark.parametrize("key", ("en-pt", "whisper-tiny-en"))
@pytest.mark.parametrize("bad", [0, -1, 1.5, "3", True])
def test_a_decoder_bounds_its_tokens_the_same_way(key, bad):
    m = loaded(key)
    with raises_exactly(f"max_tokens must be a whole number of at least 1, got {bad!r}"):
        if isinstance(m, attnviz.SpeechModel):
            m.transcribe(TONE, max_tokens=bad)
        else:
            m.translate("Hello.", max_tokens=bad)
    assert m.target_limit(4, 3) == 3 and m.target_limit(4, 10_000) == m.target_limit(4)


def test_models_of_one_kind_without_a_tokenizer_ask_for_ids():
    m = attnviz.Model(loaded("minilm").net, loaded("minilm").info)   # the same weights, no tokenizer
    with raises_exactly("model 'minilm' has no tokenizer; pass token ids instead of text"):
        m.trace("Hello.")
    assert m.trace([101, 102]).n == 2


# ---------------------------------------------------------------- adopting tensors
@pytest.mark.parametrize("key", ("minilm", "en-pt"))
def test_both_networks_adopt_a_state_through_one_check(key):
    m = loaded(key)
    state = dict(m.net.state_dict())
    dropped = next(k for k in state if k.endswith("weight") and k != "lm_head.weight")
    del state[dropped]
    build = transformer.Transformer if isinstance(m, attnviz.Model) else seq2seq.Seq2Seq
    with pytest.raises(ValueError, match=rf"^weights do not match the architecture: missing \['{re.escape(dropped)}'\]"):
        build.from_state(m.cfg, state)
    whole = build.from_state(m.cfg, dict(m.net.state_dict()))
    assert base_model.weights_fingerprint(whole) == base_model.weights_fingerprint(m.net)
