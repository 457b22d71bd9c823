"""`python -m attnviz.bench --model en-pt`: translation cost split into encoding and per-token
decoding, measured here and modelled for a Raspberry Pi."""
import io

import pandas as pd
import pytest

import attnviz
from attnviz.latency import translation_latency
from attnviz.latency.cli import main


@pytest.fixture(scope="module")
def en_pt():
    return attnviz.load_model("en-pt")


def test_modelled_encoding_grows_with_the_source_and_decoding_is_per_token(en_pt):
    short, long = (translation_latency.predict(en_pt.cfg, n, "pi4") for n in (8, 128))
    assert long["encode_ms"] > 5 * short["encode_ms"]
    # an SSRU decoder's step reads only the cross-attention's keys, so it barely grows
    assert short["decode_ms_per_token"] <= long["decode_ms_per_token"] < 1.5 * short["decode_ms_per_token"]
    assert translation_latency.predict(en_pt.cfg, 32, "pi5")["decode_ms_per_token"] < \
        translation_latency.predict(en_pt.cfg, 32, "pi4")["decode_ms_per_token"]
    # the output product over 32,000 pieces is about three quarters of a step's arithmetic
    full = sum(k * op.flops for op, k in translation_latency.step_ops(en_pt.cfg, 16, 3))
    small = sum(k * op.flops for op, k in translation_latency.step_ops(en_pt.cfg, 16, 3, vocab=256))
    assert small < full / 4


def test_the_cli_writes_one_row_per_model_backend_and_length(capsys):
    assert main(["--model", "en-pt", "--seq-lens", "4,16", "--backend", "cpu,pi4,pi5", "--repeats", "1",
                 "--warmup", "0", "--threads", "1"]) == 0
    df = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(df.columns) == ["model", "backend", "threads", "source_tokens", "encode_ms",
                                "decode_ms_per_token", "sentence_ms"]
    assert len(df) == 6 and set(df["backend"]) == {"cpu", "pi4", "pi5"}
    assert (df[["encode_ms", "decode_ms_per_token"]] > 0).all().all()
    row = df.iloc[0]
    assert row["sentence_ms"] == pytest.approx(row["encode_ms"] + 4 * row["decode_ms_per_token"])


def test_bad_requests_are_refused_with_a_message(capsys):
    for argv in (["--model", "en-pt", "--seq-lens", "1"], ["--model", "en-pt", "--backend", "gpu"],
                 ["--model", "en-pt", "--model", "minilm", "--backend", "pi4"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "source lengths" in err and "cpu, pi4 or pi5" in err and "not a translation model" in err


def test_the_latency_page_shows_translation_cost():
    from pathlib import Path
    from streamlit.testing.v1 import AppTest
    page = str(Path(__file__).resolve().parent.parent / "pages" / "4_Latency.py")
    at = AppTest.from_file(page, default_timeout=180).run()
    assert not at.exception, at.exception
    assert "en-pt" not in at.multiselect(key="latency.models").options  # the sweep is for one-pass models
    at.toggle(key="latency.translate_show").set_value(True).run()
    assert not at.exception, at.exception
    spec = at.get("plotly_chart")[-1].proto.spec
    assert "encoding (once per sentence)" in spec and "pi4" in spec
    at.checkbox(key="latency.translate_measure").check().run()
    assert not at.exception, at.exception
    assert "(measured)" in at.get("plotly_chart")[-1].proto.spec
