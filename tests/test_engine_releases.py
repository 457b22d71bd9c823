"""Engine releases in the Pi model: each profile says which engine release its published runs ran,
`engine@YEAR` picks a profile by release, and a year no published run covers is refused (an engine
changes between releases: the 2022 whisper.cpp the ggml Pi 4 profile saw is not 2025's)."""
from dataclasses import asdict
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attnviz.latency import cli
from attnviz.latency import engines, sweep
from attnviz.latency.results import read_results

TINY = "synthetic:layers=2,d=32,heads=4,ff=64,vocab=50,positions=64"


def test_every_pi_profile_names_the_release_it_models():
    rows = engines.releases()
    offered = {(d, e, t) for d in ("pi4", "pi5") for e, ts in engines.ENGINE_DTYPES.items() for t in ts}
    assert {(r["device"], r["engine"], r["dtype"]) for r in rows} == offered
    assert all(r["release"] for r in rows)
    pi4_ggml = next(r for r in rows if (r["device"], r["engine"], r["dtype"]) == ("pi4", "ggml", "fp16"))
    assert "whisper.cpp aa6adda (2022)" in pi4_ggml["release"] and pi4_ggml["years"] == "2022–2024"


def test_a_release_year_the_runs_cover_is_the_same_profile():
    for device, dtype in (("pi4", "fp16"), ("pi4", "q8_0"), ("pi5", "q4_0")):
        plain, dated = (asdict(engines.engine_profile(device, e, dtype)) for e in ("ggml", "ggml@2024"))
        assert {k: v for k, v in dated.items() if k not in ("name", "engine", "source")} == \
            {k: v for k, v in plain.items() if k not in ("name", "engine", "source")}


@pytest.mark.parametrize("spec,words", [
    ("ggml@2025", r"no published Raspberry Pi runs of ggml from 2025 calibrate pi4 ggml fp16: that profile models "
                  r"whisper\.cpp aa6adda \(2022\), llama\.cpp 2024-03-26; choose ggml@2022\.\.2024 or plain ggml"),
    ("ncnn@2024", r"ncnn from 2024.*ncnn as its benchmark tables ran it"),
    ("ggml@next", r"give the engine's release year after @, e.g. ggml@2024"),
])
def test_a_release_no_published_run_covers_is_refused_saying_what_the_profile_models(spec, words):
    dtype = "fp32" if spec.startswith("ncnn") else "fp16"
    with pytest.raises(ValueError, match=words):
        engines.engine_fit("pi4", spec, dtype)
    with pytest.raises(ValueError, match=words):   # before any row is priced
        sweep.SweepPlan(models=[TINY], seq_lens=[8], backends=["pi4"], engines=[spec], dtypes=[dtype]).check()


def test_cli_engine_at_a_year(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--model", TINY, "--seq-lens", "8", "--backend", "pi4", "--engine", "ggml@2025",
                        "--dtype", "fp16", "--no-crossover"])
    assert exit_.value.code == 2 and "that profile models whisper.cpp aa6adda (2022)" in capsys.readouterr().err
    out = tmp_path / "r.csv"
    assert cli.main(["--model", TINY, "--seq-lens", "8,16", "--backend", "pi4,pi5", "--engine", "ggml,ggml@2024",
                           "--dtype", "q8_0", "--no-crossover", "--out", str(out)]) == 0
    df = read_results(out)
    plain, dated = (df[df["engine"] == e].sort_values(["backend", "seq_len"])["median_ms"].tolist()
                    for e in ("ggml", "ggml@2024"))
    assert len(plain) == 4 and plain == dated


def test_latency_page_says_which_release_each_pi_profile_models():
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "pages" / "4_Latency.py"), default_timeout=120)
    at.run()
    assert not at.exception and not at.dataframe   # said on open, nothing computed
    said = next(c.value for c in at.caption if "Which engine release each Pi profile models" in c.value)
    assert "pi4 ggml fp16: whisper.cpp aa6adda (2022), llama.cpp 2024-03-26" in said
    assert "pi5 ggml q4_0: llama.cpp with llamafile's sgemm (2024-04-28)" in said
    assert "pi4 torch fp32, int8 (derived): PyTorch as HAT's latency dataset ran it (2020)" in said
