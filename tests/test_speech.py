"""Whisper: our modules against transformers' eager Whisper (tiny random config and the bundled
tiny.en), our greedy tokens against the ctranslate2 engine, word timing against Whisper's own
algorithm, and every kind of bad audio."""
from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import attnviz
from attnviz.core.speech_model import APPENDED, Transcript, Word, alignment_matrix, dtw, merge_punctuation
from attnviz.uploads import audio
from attnviz.weights.families.ctranslate2 import read_model_bin
from attnviz.weights.catalogue import bundled_path

import ctranslate2  # noqa: E402  (test-only reference engine, in requirements.txt: never skipped)
from transformers import WhisperConfig as HFConfig, WhisperForConditionalGeneration  # noqa: E402

CLIP = Path(attnviz.__file__).parent / "data" / "audio" / "hello_world.wav"
TOL = 1e-4


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def model():
    return attnviz.load_model("whisper-tiny-en")


@pytest.fixture(scope="module")
def clip() -> bytes:
    return CLIP.read_bytes()


@pytest.fixture(scope="module")
def heard(model, clip) -> Transcript:
    return model.transcribe(clip)


def tiny_hf(seed=0):
    torch.manual_seed(seed)
    hc = HFConfig(vocab_size=120, num_mel_bins=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64,
                  max_source_positions=40, max_target_positions=24, decoder_start_token_id=100,
                  eos_token_id=101, pad_token_id=101, bos_token_id=101, attn_implementation="eager")
    hf = WhisperForConditionalGeneration(hc).eval()
    with torch.no_grad():  # random biases and norms too (fresh ones are 0 and 1); positions stay sinusoids
        for name, p in hf.named_parameters():
            if "encoder.embed_positions" not in name:
                p.add_(torch.randn_like(p) * 0.1)
    hf.generation_config.no_timestamps_token_id = 102
    hf.generation_config.alignment_heads = [[1, 0], [1, 3]]
    return hf


def hf_state_from_ct2(variables: dict, cfg) -> dict:
    """CTranslate2 WhisperSpec -> transformers names, written independently of our converter."""
    t = lambda name: torch.from_numpy(np.asarray(variables[name], dtype=np.float32).copy())  # noqa: E731
    d, sd = cfg.d_model, {}

    def lin(hf, ct, bias=True):
        sd[hf + ".weight"] = t(ct + "/weight")
        if bias:
            sd[hf + ".bias"] = t(ct + "/bias")

    def ln(hf, ct):
        sd[hf + ".weight"], sd[hf + ".bias"] = t(ct + "/gamma"), t(ct + "/beta")

    for side, n in (("encoder", cfg.n_enc_layers), ("decoder", cfg.n_dec_layers)):
        for i in range(n):
            p, c = f"model.{side}.layers.{i}.", f"{side}/layer_{i}/"
            w, b = t(c + "self_attention/linear_0/weight"), t(c + "self_attention/linear_0/bias")
            for j, x in enumerate("qkv"):
                sd[p + f"self_attn.{x}_proj.weight"] = w[j * d:(j + 1) * d]
                if x != "k":
                    sd[p + f"self_attn.{x}_proj.bias"] = b[j * d:(j + 1) * d]
            lin(p + "self_attn.out_proj", c + "self_attention/linear_1")
            ln(p + "self_attn_layer_norm", c + "self_attention/layer_norm")
            if side == "decoder":
                lin(p + "encoder_attn.q_proj", c + "attention/linear_0")
                w, b = t(c + "attention/linear_1/weight"), t(c + "attention/linear_1/bias")
                sd[p + "encoder_attn.k_proj.weight"], sd[p + "encoder_attn.v_proj.weight"] = w[:d], w[d:]
                sd[p + "encoder_attn.v_proj.bias"] = b[d:]
                lin(p + "encoder_attn.out_proj", c + "attention/linear_2")
                ln(p + "encoder_attn_layer_norm", c + "attention/layer_norm")
            ln(p + "final_layer_norm", c + "ffn/layer_norm")
            lin(p + "fc1", c + "ffn/linear_0")
            lin(p + "fc2", c + "ffn/linear_1")
    for i in (1, 2):
        lin(f"model.encoder.conv{i}", f"encoder/conv{i}")
    sd["model.encoder.embed_positions.weight"] = t("encoder/position_encodings/encodings")
    ln("model.encoder.layer_norm", "encoder/layer_norm")
    ln("model.decoder.layer_norm", "decoder/layer_norm")
    sd["model.decoder.embed_tokens.weight"] = t("decoder/embeddings/weight")
    sd["model.decoder.embed_positions.weight"] = t("decoder/position_encodings/encodings")
    sd["proj_out.weight"] = sd["model.decoder.embed_tokens.weight"]
    return sd


def maxdiff(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


# ---------------------------------------------------------------- tiny random config
def test_tiny_random_whisper_matches_transformers_eager():
    hf = tiny_hf()
    ours = attnviz.from_hf(hf)
    assert ours.cfg.alignment_heads == ((1, 0), (1, 3)) and ours.cfg.prompt() == [100, 102]
    feats = torch.randn(1, 16, 80)
    dec = torch.tensor([[100, 102, 5, 7, 9, 11, 13]])
    with torch.no_grad():
        ref = hf(input_features=feats, decoder_input_ids=dec, output_attentions=True)
    with torch.inference_mode():
        memory, enc = ours.net.encode(feats, need_weights=True)
        out = ours.net.step(dec, ours.net.start(memory), need_weights=True, need_self=True)
    assert maxdiff(memory, ref.encoder_last_hidden_state) <= TOL
    assert maxdiff(out.logits, ref.logits) <= TOL
    for i in range(2):
        assert maxdiff(enc[i], ref.encoder_attentions[i]) <= TOL
        assert maxdiff(out.cross[i], ref.cross_attentions[i]) <= TOL
        assert maxdiff(out.self_att[i], ref.decoder_attentions[i]) <= TOL
    # incremental decoding (self-attention K/V cached, no weights: the fused path) = the full pass
    with torch.inference_mode():
        state = ours.net.start(memory)
        steps = [ours.net.step(dec[:, :2], state).logits]
        steps += [ours.net.step(dec[:, t:t + 1], state).logits for t in range(2, dec.shape[1])]
    assert maxdiff(torch.cat(steps, 1), ref.logits) <= TOL


def test_tiny_random_masked_cross_heads_match_transformers_with_zeroed_heads():
    hf = tiny_hf(1)
    ours = attnviz.from_hf(hf)
    mask = torch.ones(2, 4)
    mask[0, 1] = mask[1, 2] = 0.0
    feats, dec = torch.randn(1, 16, 80), torch.tensor([[100, 102, 3, 4, 5]])

    def zero_heads(layer):  # transformers: zero a head's slice of the output projection's input
        def hook(module, args):
            x = args[0].clone()
            x.view(*x.shape[:-1], 4, 8)[..., mask[layer] == 0, :] = 0
            return (x,)
        return hook
    hooks = [hf.model.decoder.layers[i].encoder_attn.out_proj.register_forward_pre_hook(zero_heads(i))
             for i in range(2)]
    with torch.no_grad():
        ref = hf(input_features=feats, decoder_input_ids=dec).logits
    for h in hooks:
        h.remove()
    with torch.inference_mode():
        memory, _ = ours.net.encode(feats)
        got = ours.net.step(dec, ours.net.start(memory), head_mask=mask).logits
    assert maxdiff(got, ref) <= TOL


# ---------------------------------------------------------------- the bundled weights
def test_bundled_model_is_listed_and_converted_once(model):
    info = next(m for m in attnviz.list_models() if m.key == "whisper-tiny-en")
    assert info.task == "speech" and info.family == "whisper"
    assert model.cfg.alignment_heads == ((1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4))
    assert model.cfg.prompt() == [50257, 50362]  # English-only: no language or task token
    assert attnviz.load_model("whisper-tiny-en").fingerprint() == model.fingerprint()


@pytest.fixture(scope="module")
def hf_heard(model, heard):
    """transformers' eager Whisper with the bundled weights, teacher-forced on our transcript."""
    folder = bundled_path("whisper-tiny-en")
    variables, header = read_model_bin(folder / "model.bin")
    assert header["spec"] == "WhisperSpec"
    c = model.cfg
    hc = HFConfig(vocab_size=c.vocab_size, num_mel_bins=80, encoder_layers=4, decoder_layers=4,
                  encoder_attention_heads=6, decoder_attention_heads=6, d_model=384, encoder_ffn_dim=1536,
                  decoder_ffn_dim=1536, decoder_start_token_id=c.sot_id, eos_token_id=c.eos_id,
                  pad_token_id=c.eos_id, bos_token_id=c.eos_id, attn_implementation="eager")
    hf = WhisperForConditionalGeneration(hc).eval()
    missing, unexpected = hf.load_state_dict(hf_state_from_ct2(variables, c), strict=False)
    assert not [k for k in missing if k != "proj_out.weight"] and not unexpected
    hf.proj_out.weight = hf.model.decoder.embed_tokens.weight
    feats = heard.features[None]
    dec = torch.tensor([c.prompt() + heard.ids.tolist()])
    with torch.no_grad():
        return hf(input_features=feats, decoder_input_ids=dec, output_attentions=True)


def test_bundled_weights_match_transformers_eager(model, heard, hf_heard):
    ref, c = hf_heard, model.cfg
    dec = torch.tensor([c.prompt() + heard.ids.tolist()])
    with torch.inference_mode():
        memory, enc = model.encode_audio(heard.features, attentions=True)
        out = model.net.step(dec, model.net.start(memory), need_weights=True)
    assert maxdiff(memory, ref.encoder_last_hidden_state) <= TOL
    assert maxdiff(out.logits, ref.logits) <= TOL
    for i in range(4):
        assert maxdiff(enc[i], ref.encoder_attentions[i][0]) <= TOL
        assert maxdiff(out.cross[i], ref.cross_attentions[i]) <= TOL
    # the greedy rows the transcript keeps are the teacher-forced rows from the last prompt token on
    n = len(c.prompt())
    cross = torch.stack([ref.cross_attentions[i][0, :, n - 1:-1] for i in range(4)])
    assert maxdiff(heard.cross_attentions, cross) <= TOL


def test_greedy_tokens_identical_to_ctranslate2(model, heard, clip):
    folder = str(bundled_path("whisper-tiny-en"))
    engine = ctranslate2.models.Whisper(folder, device="cpu", compute_type="float32", intra_threads=1)
    prompt = [["<|startoftranscript|>", "<|notimestamps|>"]]
    quiet = (audio.read_audio(clip).samples * 0.3
             + np.random.default_rng(0).normal(0, 0.01, 61066).astype(np.float32))
    for samples, ours in ((None, heard), (quiet, model.transcribe(quiet))):
        feats = heard.features if samples is None else model.features(audio.read_audio(samples))
        ref = engine.generate(ctranslate2.StorageView.from_array(feats[None].numpy()), prompt, beam_size=1)
        assert ours.ids.tolist() == ref[0].sequences_ids[0] + [model.cfg.eos_id]
    assert heard.text == "Hello World, this is a test on speech recognition."


# ---------------------------------------------------------------- the transcript
def test_transcript_shapes_and_rows(model, heard):
    L, H = model.cfg.n_dec_layers, model.cfg.n_heads
    assert heard.cross_attentions.shape == (L, H, heard.n_tokens, 1500)
    assert torch.allclose(heard.cross_attentions.sum(-1), torch.ones(L, H, heard.n_tokens), atol=1e-4)
    assert heard.tokens[-1] == "<|endoftext|>" and heard.encoder_attentions is None
    assert heard.audio_frames == 61066 // 320 and heard.stopped == "eos"
    assert list(heard.features.shape) == [80, 3000]


def test_word_times_follow_the_speech(heard):
    words = heard.words
    assert [w.text.strip() for w in words] == ["Hello", "World,", "this", "is", "a", "test", "on", "speech",
                                                "recognition."]
    starts = [w.start for w in words]
    assert starts == sorted(starts) and all(w.start <= w.end for w in words)
    assert words[-1].end <= heard.seconds + 0.02
    # espeak-ng leaves a pause after "world,": the quietest 100 ms between the 2nd and 3rd words' starts
    samples = heard.audio.samples
    frames = samples[: len(samples) // 320 * 320].reshape(-1, 320)
    energy = (frames ** 2).mean(1)                     # per 20 ms
    a, b = int(words[1].start * 50), int(words[2].start * 50)
    quiet = a + int(np.argmin(np.convolve(energy[a:b], np.ones(5), "same")))
    assert words[1].end - 0.2 <= quiet / 50 <= words[2].start + 0.2


def test_word_times_equal_transformers_whisper_timing(model, heard, hf_heard):
    """transformers' own median filter and DTW (its Whisper token timestamps) on its own cross-
    attention give the same word boundaries."""
    from transformers.models.whisper.generation_whisper import _dynamic_time_warping, _median_filter
    w = torch.stack([hf_heard.cross_attentions[l][0, h] for l, h in model.cfg.alignment_heads])
    w = w[:, :, :heard.audio_frames]
    w = w / w.sum(-1, keepdim=True)
    std, mean = torch.std_mean(w, dim=-2, keepdim=True, unbiased=False)
    matrix = _median_filter((w - mean) / std, 7).mean(0)[len(model.cfg.prompt()) - 1:-1]
    rows, cols = _dynamic_time_warping(-matrix.double().numpy())
    starts = cols[np.concatenate([[True], np.diff(rows) > 0])] * 0.02     # the first frame of each token
    first = [w.tokens[0] for w in heard.words]
    assert [w.start for w in heard.words] == pytest.approx(starts[first].tolist())
    # a word ends where the token after it starts; a closing mark joins its word keeping that end
    def last(w):
        marks = [t for t in w.tokens if model.tokenizer.decode([int(heard.ids[t])]).strip() in APPENDED]
        return w.tokens[-1] - len(marks)
    ends = starts[[last(w) + 1 for w in heard.words]].tolist()
    assert [w.end for w in heard.words[:-1]] == pytest.approx(ends[:-1])
    # the last word alone ends later: where its sound ends (tests/test_speech_second_pass.py), not
    # where the path turns to the end of text
    assert heard.words[-1].end >= ends[-1]


def whisper_dtw(x):
    """Whisper's `dtw_cpu` + `backtrace`, loop for loop: the reference for ours."""
    N, M = x.shape
    cost = np.ones((N + 1, M + 1), dtype=np.float32) * np.inf
    trace = -np.ones((N + 1, M + 1), dtype=np.float32)
    cost[0, 0] = 0
    for j in range(1, M + 1):
        for i in range(1, N + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i, j] = x[i - 1, j - 1] + c
            trace[i, j] = t
    i, j = N, M
    trace[0, :], trace[:, 0] = 2, 1
    out = []
    while i > 0 or j > 0:
        out.append((i - 1, j - 1))
        i, j = (i - 1, j - 1) if trace[i, j] == 0 else (i - 1, j) if trace[i, j] == 1 else (i, j - 1)
    return np.array(out)[::-1].T


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (6, 40), (12, 90)])
def test_dtw_path_equals_whispers(shape):
    x = np.random.default_rng(shape[0]).normal(size=shape).astype(np.float32)
    rows, cols = dtw(x)
    ref = whisper_dtw(x)
    assert np.array_equal(rows, ref[0]) and np.array_equal(cols, ref[1])


def test_alignment_matrix_is_whispers_normalised_median_filtered_mean():
    rng = np.random.default_rng(0)
    w = torch.softmax(torch.from_numpy(rng.normal(size=(3, 9, 50))), -1)
    got = alignment_matrix(w.numpy(), 1, 30)
    # Whisper's steps in torch: softmax over the audio frames, standardise, median filter, mean
    x = w[:, :, :30] / w[:, :, :30].sum(-1, keepdim=True)
    std, mean = torch.std_mean(x, dim=-2, keepdim=True, unbiased=False)
    x = (x - mean) / std
    x = torch.nn.functional.pad(x[None], (3, 3, 0, 0), mode="reflect")[0]
    x = x.unfold(-1, 7, 1).sort()[0][..., 3]
    assert np.allclose(got, x.mean(0)[1:-1].numpy(), atol=1e-6)


def test_punctuation_joins_its_word():
    words = [Word(" Hello", 0, 1, 1, [0]), Word(",", 1, 1.1, 1, [1]), Word(" \"", 1.1, 1.2, 1, [2]),
             Word("world", 1.2, 2, 1, [3]), Word(".", 2, 2.1, 1, [4])]
    out = merge_punctuation(words)
    assert [(w.text, w.tokens) for w in out] == [(" Hello,", [0, 1]), (" \"world.", [2, 3, 4])]


def test_head_mask_changes_the_transcript_and_leaves_the_model_alone(model, clip, heard):
    before = model.fingerprint()
    mask = torch.ones(model.cfg.n_dec_layers, model.cfg.n_heads)
    mask[2:] = 0.0  # the upper decoder layers' cross-attention, where most alignment heads sit
    masked = model.transcribe(clip, head_mask=mask, max_tokens=24)
    assert masked.ids.tolist() != heard.ids.tolist()
    assert model.fingerprint() == before
    with pytest.raises(ValueError, match="shape"):
        model.transcribe(clip, head_mask=torch.ones(3, 6))


# ---------------------------------------------------------------- input
def wav(samples, rate=16_000, subtype="PCM_16", fmt="WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, subtype=subtype, format=fmt)
    return buf.getvalue()


def test_stereo_is_downmixed_and_other_rates_resampled(clip):
    mono = audio.read_audio(clip).samples
    stereo = audio.read_audio(wav(np.stack([mono, mono], 1), subtype="FLOAT"))
    assert stereo.channels == 2 and np.allclose(stereo.samples, mono, atol=1e-6)
    t = np.arange(48_000) / 48_000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    for rate in (8_000, 96_000):
        x = (0.5 * np.sin(2 * np.pi * 440 * np.arange(rate) / rate)).astype(np.float32)
        got = audio.read_audio(wav(x, rate, *(("PCM_16", "FLAC") if rate == 8_000 else ("FLOAT", "WAV"))))
        assert got.source_rate == rate and abs(len(got.samples) - 16_000) <= 1
        spectrum = np.abs(np.fft.rfft(got.samples))
        assert abs(int(np.argmax(spectrum)) - 440) <= 1   # 1 Hz bins: the tone stays at 440 Hz
    assert audio.read_audio(tone[::3]).format == "array"
    assert audio.read_audio((tone * 32767).astype(np.int16)).samples.max() == pytest.approx(0.5, abs=1e-3)


@pytest.mark.parametrize("what, data, message", [
    ("empty", b"", "empty"),
    ("text", b"this is not audio at all, only words" * 20, "not audio"),
    ("png", b"\x89PNG\r\n\x1a\n" + bytes(200), "not audio"),
])
def test_bytes_that_are_not_audio(what, data, message):
    with pytest.raises(ValueError, match=message):
        audio.read_audio(data)


def test_silence_clipping_and_bad_arrays():
    with pytest.raises(ValueError, match="silent"):
        audio.read_audio(wav(np.zeros(16_000, dtype=np.float32)))
    noise = np.sign(np.random.default_rng(0).normal(size=16_000)).astype(np.float32)
    with pytest.raises(ValueError, match="clipped"):
        audio.read_audio(wav(noise))
    with pytest.raises(ValueError, match="NaN"):
        audio.read_audio(np.full(16_000, np.nan, dtype=np.float32))
    with pytest.raises(ValueError, match="at least"):
        audio.read_audio(np.full(100, 0.1, dtype=np.float32))
    for bad in ("hello", np.zeros((2, 2, 2)), np.array([], dtype=np.float32), [[0.1] * 20] * 2000):
        with pytest.raises(ValueError):
            audio.read_audio(bad)


def test_long_audio_is_refused_or_cut(clip):
    x = np.tile(audio.read_audio(clip).samples, 10)            # 38 s
    with pytest.raises(ValueError, match="30 s at a time"):
        audio.read_audio(wav(x))
    cut = audio.read_audio(wav(x), cut=True)
    assert cut.duration == pytest.approx(30.0) and cut.truncated_seconds == pytest.approx(len(x) / 16_000 - 30)


def test_big_uploads_are_refused_from_the_header(set_limits):
    header = wav(np.full(1600, 0.1, dtype=np.float32))              # a real WAV header, 0.1 s of data ...
    i = header.find(b"data")
    long_claim = header[:i + 4] + struct.pack("<I", 20 * 10**6 - 44) + header[i + 8:]
    padded = long_claim + bytes(20 * 10**6 - len(long_claim))       # ... padded to a 20 MB upload: 625 s
    with pytest.raises(ValueError, match="limit is 120 s"):
        audio.read_audio(padded)
    with pytest.raises(ValueError, match=r"is 20\.000001 MB; the limit is 20\.000000 MB"):  # the real sizes
        audio.read_audio(padded + b"\0")
    set_limits(max_audio_bytes=1000)
    with pytest.raises(ValueError, match=r"is 0\.005 MB; the limit is 0\.001 MB"):
        audio.read_audio(header + bytes(2000))


def test_a_header_that_lies_about_its_length(clip):
    i = clip.find(b"data")
    n = struct.unpack("<I", clip[i + 4:i + 8])[0]
    lying = clip[:i + 4] + struct.pack("<I", 10 * n) + clip[i + 8:]
    with pytest.raises(ValueError, match="cut short or its header is wrong"):
        audio.read_audio(lying)
    with pytest.raises(ValueError, match="cut short"):
        audio.read_audio(clip[: len(clip) // 3])
    streamed = clip[:i + 4] + struct.pack("<I", 0xFFFFFFFF) + clip[i + 8:]   # left open by a streaming writer
    assert len(audio.read_audio(streamed).samples) == n // 2
