"""The speech encoders (wav2vec 2.0, HuBERT) beyond their rows in the parity table: from a saved
folder and by name from a Hugging Face cache, their audio read through the folder's own feature
extractor; checkpoints of the older weight-norm naming; the options refused by name."""
import io

import numpy as np
import pytest
import soundfile
import torch
import transformers as tf

import attnviz
from attnviz.weights.families import convert
from tests import hub_cache
from tests.hub_cache import lay_out
from tests.test_parity import AUDIO, TOL, inputs, reference, tiny

RATE = 16_000


@pytest.fixture
def cache(tmp_path, monkeypatch):
    return hub_cache.offline_for_test(monkeypatch, tmp_path / "hf" / "hub", tmp_path / "converted")


def samples(n: int = 1600, seed: int = 4) -> np.ndarray:
    """A tone in noise, 16 kHz (not normalised: the feature extractor does that)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / RATE
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(n)).astype(np.float32)


@pytest.mark.parametrize("row", list(AUDIO))
def test_folder_and_hub_cache_round_trip_through_the_feature_extractor(row, cache, tmp_path):
    folder = tmp_path / row
    hf = tiny(row)
    hf.save_pretrained(folder)
    extractor = tf.Wav2Vec2FeatureExtractor(do_normalize=True)
    extractor.save_pretrained(folder)
    audio = samples()
    values = torch.from_numpy(extractor(audio, sampling_rate=RATE, return_tensors="np")["input_values"][0])
    hidden, att, logits = reference(hf, values)
    from_folder = attnviz.load_model(str(folder))
    lay_out(cache, f"org/{row}", folder)
    by_name = attnviz.load_model(f"org/{row}")
    assert by_name.cfg == from_folder.cfg and from_folder.kind == "audio"
    wav = io.BytesIO()
    soundfile.write(wav, audio, RATE, format="WAV", subtype="FLOAT")
    for model, x in ((from_folder, audio), (by_name, audio), (by_name, wav.getvalue())):
        tr = model.trace(x)
        assert (tr.attentions - att).abs().max() < TOL
        if logits is not None:
            assert (tr.logits - logits[0]).abs().max() < TOL
        else:
            assert (tr.hidden - hidden).abs().max() < TOL
        assert tr.n == att.shape[-1] and tr.seconds_per_token == 20 / RATE and tr.tokens[1] == "0.001s"


def test_a_ctc_models_hidden_states_are_its_encoders_output():
    hf = tiny("wav2vec2_ctc")
    x = inputs(hf)
    with torch.no_grad():
        want = hf.wav2vec2(input_values=x[None]).last_hidden_state[0]
    assert (attnviz.from_hf(hf).trace(x).hidden - want).abs().max() < TOL


def test_the_older_weight_norm_names_are_folded_as_the_newer_ones():
    """Checkpoints written before torch's parametrizations store `weight_g` / `weight_v`."""
    hf = tiny("wav2vec2")
    sd = {k.replace("parametrizations.weight.original0", "weight_g").replace("parametrizations.weight.original1",
                                                                            "weight_v"): v
          for k, v in hf.state_dict().items()}
    assert any(k.endswith("weight_g") for k in sd)
    cfg, state = convert(hf.config, sd)
    with torch.no_grad():
        want = hf.encoder.pos_conv_embed.conv.weight
    assert (state["audio.pos_conv.weight"] - want).abs().max() < 1e-6


REFUSED = [("wav2vec2", dict(add_adapter=True), "add_adapter"),
           ("wav2vec2_ctc", dict(adapter_attn_dim=8), "adapter_attn_dim"),
           ("hubert", dict(conv_pos_batch_norm=True), "conv_pos_batch_norm"),
           ("hubert", dict(feat_extract_norm="batch"), "feat_extract_norm")]


@pytest.mark.parametrize("row,over,option", REFUSED)
def test_options_we_do_not_implement_are_refused_by_name(row, over, option):
    hf = tiny(row)
    hf.config.update(over)
    with pytest.raises(ValueError, match=option):
        attnviz.from_hf(hf)


def test_bad_audio_input_is_a_clear_error():
    ours = attnviz.from_hf(tiny("hubert"))
    with pytest.raises(ValueError, match="takes audio"):
        ours.trace("some text")
    with pytest.raises(ValueError, match="at least 40"):   # kernels 10, 3, 3, strides 5, 2: 10 + 5 (2 + 2 x 2)
        ours.trace(torch.randn(39))
    with pytest.raises(ValueError, match="shorten"):
        ours.trace(torch.randn(30 * RATE + 40))


@pytest.mark.parametrize("row", list(AUDIO))
def test_what_a_block_explains_is_the_traced_attention_over_frames(row):
    """Analyses read a block's attention (`Block.explain`), never rebuild it: over audio frames, with
    post-norm and pre-norm blocks, it gives the traced weights, whole and row by row."""
    hf = tiny(row)
    ours = attnviz.from_hf(hf)
    tr = ours.trace(inputs(hf), states=True)
    for layer in range(ours.cfg.n_layers):
        scored = ours.net.blocks[layer].explain(tr.states[layer][None], **ours.net.shared(tr.n))
        assert (scored.weights()[0] - tr.attentions[layer]).abs().max() < 1e-5
        assert (scored.weights(3, 7)[0] - tr.attentions[layer][:, 3:7]).abs().max() < 1e-5
