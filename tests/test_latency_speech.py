"""`python -m attnviz.bench --model whisper-tiny-en`: Whisper's cost split into one encoding of a
30 s window and per-token decoding, measured here and modelled for a Raspberry Pi per engine."""
import io

import pandas as pd
import pytest
import torch

from attnviz.core.speech_model import SpeechModel
from attnviz.core.whisper_net import Whisper, whisper_config
from attnviz.latency import speech_latency, translation_latency
from attnviz.latency.cli import main
from attnviz.latency.published import RUNS, WHISPER_SHAPES

TINY_EN = (4, 384, 6)  # whisper tiny's encoder: layers, d, heads


def tiny_whisper() -> SpeechModel:
    """A random Whisper small enough to measure in a test (40 audio frames, d 32)."""
    torch.manual_seed(0)
    cfg = whisper_config(n_enc_layers=2, n_dec_layers=2, n_heads=4, d_model=32, d_ff=64, vocab_size=120,
                         n_mels=16, n_audio_ctx=40, n_text_ctx=24, sot_id=100, no_timestamps_id=102,
                         eos_id=101, decoder_start_id=100)
    return SpeechModel.build(cfg, Whisper(cfg).state_dict(), "tiny-random", "a test")


def tiny_en_config():
    """whisper tiny.en's shape (no weights: the cost model reads only the config)."""
    return whisper_config(n_enc_layers=4, n_dec_layers=4, n_heads=6, d_model=384, d_ff=1536, vocab_size=51864,
                          eos_id=50256, decoder_start_id=50257)


def test_the_modelled_encoder_matches_the_published_whisper_cpp_runs():
    assert WHISPER_SHAPES["tiny"] == TINY_EN
    cfg = tiny_en_config()
    anchors = [r for r in RUNS if "whisper.cpp" in r.source and r.shape.startswith(
        "synthetic:family=gpt2,layers=4,d=384,heads=6,")]
    assert {r.device for r in anchors} == {"pi4", "pi5"}
    for r in anchors:
        got = speech_latency.predict(cfg, r.device, r.engine, r.dtype, r.threads)["encode_ms"]
        assert got == pytest.approx(r.published, rel=0.25), r.label
        assert speech_latency.published_encode(cfg, r.device, r.engine, r.dtype, r.threads) == r.published
    pi4, pi5 = (speech_latency.predict(cfg, d, "ggml", "fp16") for d in ("pi4", "pi5"))
    assert pi5["encode_ms"] < pi4["encode_ms"] and pi5["decode_ms_per_token"] < pi4["decode_ms_per_token"]
    # a step is far cheaper than the window's encoding, yet reads all 1,500 frames in cross-attention
    assert 50 * pi5["decode_ms_per_token"] < pi5["encode_ms"]
    assert speech_latency.published_encode(cfg, "pi5", "torch", "fp32", 4) is None


def test_the_sweep_measures_here_and_models_each_engine_at_its_dtypes():
    model = tiny_whisper()
    df = speech_latency.sweep({"tiny": model}, ["cpu", "pi4", "pi5"], ["torch", "ggml"], ["fp32", "fp16"], [4],
                      repeats=1, warmup=0)
    assert list(df.columns) == speech_latency.COLUMNS
    # cpu: torch fp32 measured; each Pi: torch fp32 and ggml fp16 (ggml runs no fp32, torch no fp16)
    runs = df.groupby(["backend", "engine", "dtype"]).size()
    assert runs.to_dict() == {("cpu", "torch", "fp32"): 2, ("pi4", "ggml", "fp16"): 2, ("pi4", "torch", "fp32"): 2,
                              ("pi5", "ggml", "fp16"): 2, ("pi5", "torch", "fp32"): 2}
    assert set(df["phase"]) == {"encode", "decode"} and (df["ms"] > 0).all()
    assert (df["frames"] == 40).all()
    assert set(df[df["phase"] == "decode"]["tokens"]) == {translation_latency.DECODE_STEPS}
    assert (df[df["backend"] != "cpu"]["threads"] == 4).all()
    assert df["published_ms"].isna().all()  # no published run of a random shape


def test_the_cli_writes_encode_and_decode_rows_per_engine(capsys):
    assert main(["--model", "whisper-tiny-en", "--backend", "pi4,pi5", "--engine", "torch,ggml",
                 "--dtype", "fp32,fp16,q8_0"]) == 0
    df = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(df.columns) == speech_latency.COLUMNS
    assert len(df) == 2 * 2 * 3 and set(df["phase"]) == {"encode", "decode"}
    assert set(zip(df["engine"], df["dtype"])) == {("torch", "fp32"), ("ggml", "fp16"), ("ggml", "q8_0")}
    assert (df["frames"] == 1500).all() and (df["threads"] == 4).all()
    anchor = df[(df["backend"] == "pi5") & (df["engine"] == "ggml") & (df["dtype"] == "fp16")
                & (df["phase"] == "encode")].iloc[0]
    assert anchor["published_ms"] == 1106.11
    assert anchor["ms"] == pytest.approx(anchor["published_ms"], rel=0.25)


def test_bad_requests_are_refused_with_a_message(capsys):
    for argv in (["--model", "whisper-tiny-en", "--backend", "gpu"],
                 ["--model", "whisper-tiny-en", "--backend", "pi4", "--engine", "onnx"],
                 ["--model", "whisper-tiny-en", "--backend", "pi4", "--engine", "ggml", "--dtype", "fp32"],
                 ["--model", "whisper-tiny-en", "--model", "minilm", "--backend", "pi4"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "cpu, pi4 or pi5" in err and "unknown engine" in err and "ggml runs fp16" in err
    assert "not a speech model" in err


def test_the_latency_page_shows_whisper_cost():
    from pathlib import Path
    from streamlit.testing.v1 import AppTest
    page = str(Path(__file__).resolve().parent.parent / "pages" / "4_Latency.py")
    at = AppTest.from_file(page, default_timeout=180).run()
    assert not at.exception, at.exception
    assert "whisper-tiny-en" not in at.multiselect(key="latency.models").options  # the sweep is for one-pass models
    at.toggle(key="latency.speech_show").set_value(True).run()
    assert not at.exception, at.exception
    table = at.dataframe[-1].value
    assert set(table["backend"]) == {"pi4", "pi5"} and set(table["engine"]) == {"torch", "ggml"}
    anchored = table[(table["backend"] == "pi5") & (table["engine"] == "ggml")].iloc[0]
    assert anchored["published encode ms"] == 1106.11
    assert anchored["encode ms (30 s window)"] == pytest.approx(1106.11, rel=0.25)
    at.checkbox(key="latency.speech_measure").check().run()
    assert not at.exception, at.exception
    measured = at.dataframe[-1].value
    assert measured[measured["backend"] == "cpu"]["decode ms / token"].iloc[0] > 0
