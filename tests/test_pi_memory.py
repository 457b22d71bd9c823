"""Modelled rows need no host memory: a sweep with no cpu backend builds no model and is not held
to this host's memory budget; a modelled Pi row's model is held against the Pi's RAM instead."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attnviz.latency import cli
from attnviz.latency import measure, pi_memory, sweep
from attnviz.latency.results import read_results

LLAMA_1B = ("synthetic:family=llama,layers=16,d=2048,heads=32,kv=8,ff=8192,vocab=128256,positions=4096,"
            "causal=1")
LLAMA_7B = "synthetic:family=llama,layers=32,d=4096,heads=32,ff=11008,vocab=32000,positions=4096,causal=1"
TINY = "synthetic:layers=2,d=32,heads=4,ff=64,vocab=50,positions=64"


def no_build(spec):
    raise AssertionError(f"a modelled sweep built {spec}")


def test_the_issue_command_runs_with_a_tiny_host_budget_and_builds_no_model(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "memory_budget_mb", lambda: 100.0)   # a busy host: 100 MB free
    monkeypatch.setattr(cli, "load", no_build)
    monkeypatch.setattr(measure, "memory_budget_mb", lambda: 100.0)
    out = tmp_path / "pi.csv"
    code = cli.main(["--model", LLAMA_1B, "--backend", "pi4", "--engine", "ggml", "--dtype", "q4_0",
                           "--decode-depths", "0", "--n-prompt", "512", "--seq-lens", "512", "--no-memory",
                           "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    df = read_results(out)
    assert set(df["backend"]) == {"pi4"} and not df["measured"].any() and len(df) == 3  # a pass, pp, tg
    assert "peak about 0 MB here" in err and "note:" not in err  # q4_0: ~0.7 GB fits every Pi 4


def test_a_model_too_big_for_the_pi_is_said_so_and_still_priced(monkeypatch, capsys):
    monkeypatch.setattr(cli, "load", no_build)
    code = cli.main(["--model", LLAMA_7B, "--backend", "pi4,pi5", "--engine", "ggml", "--dtype", "fp16,q4_0",
                           "--seq-lens", "128", "--no-memory"])
    captured = capsys.readouterr()
    assert code == 0
    notes = [line for line in captured.err.splitlines() if line.startswith("note:")]
    # fp16 7B: ~12.9 GB: no Pi 4 (8 GB at most) holds it, a 16 GB Pi 5 does; q4_0 ~3.6 GB: 4 GB boards and up
    assert any("Pi 4 in fp16" in n and "would not fit there" in n for n in notes), notes
    assert any("Pi 5 in fp16" in n and "16 GB of RAM or more" in n for n in notes), notes
    assert any("Pi 4 in q4_0" in n and "4 GB of RAM or more" in n and "1 / 2 GB" in n for n in notes), notes
    assert len(captured.out.splitlines()) == 1 + 2 * 2      # every row still written


def test_ram_notes_compare_weights_in_the_engine_dtype_and_activations_with_each_board():
    plan = sweep.SweepPlan(models=[LLAMA_7B], seq_lens=[128], backends=["pi4"], engines=["ggml"],
                           dtypes=["fp16", "q8_0", "q4_0"])
    cfg = sweep.configs_of(plan.models)[LLAMA_7B]
    mb = {d: pi_memory.device_mb(cfg, 128, d) for d in plan.dtypes}
    assert mb["fp16"] > 8 * 1024 > mb["q8_0"] > 4 * 1024 > mb["q4_0"] > 2 * 1024
    fits = [fits for fits, _ in pi_memory.ram_notes(plan, {LLAMA_7B: cfg})]
    assert fits == [False, False, False]
    tiny = sweep.SweepPlan(models=[TINY], seq_lens=[16], backends=["pi4", "pi5"])
    assert [f for f, _ in pi_memory.ram_notes(tiny, sweep.configs_of(tiny.models))] == [True, True]


def test_modelled_rows_of_a_weightless_shape_equal_those_of_the_built_model():
    plan = sweep.SweepPlan(models=[TINY], seq_lens=[8, 16], heads=[2, 4], backends=["pi4", "pi5"],
                           engines=["torch", "ggml"], dtypes=["fp32", "fp16"])
    configs = sweep.configs_of(plan.models)
    assert sweep.estimate(plan, configs).peak_mb == 0        # nothing runs here
    weightless = pi_memory.models_for(plan, configs, no_build)
    built = {TINY: measure.load(TINY)}
    a, b = sweep.run_sweep(plan, weightless), sweep.run_sweep(plan, built)
    cols = ["backend", "engine", "dtype", "n_heads", "seq_len", "median_ms", "peak_mem_mb", "shape"]
    assert len(a) == 2 * 2 * 2 * 2 and a[cols].equals(b[cols])
    with_cpu = sweep.SweepPlan(models=[TINY], seq_lens=[8], backends=["cpu", "pi4"])
    assert sweep.estimate(with_cpu, configs).peak_mb > 0
    with pytest.raises(AssertionError, match="built"):
        pi_memory.models_for(with_cpu, configs, no_build)


def test_latency_page_prices_a_model_too_big_for_this_host_on_the_pi_and_says_it_would_not_fit():
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "pages" / "4_Latency.py"), default_timeout=120)
    at.run()
    at.multiselect(key="latency.models").set_value([])
    at.text_area(key="latency.synthetic").input(LLAMA_7B)
    at.text_input(key="latency.seq").input("128")
    at.multiselect(key="latency.backends").set_value(["pi4"])
    at.number_input(key="latency.budget_mb").set_value(100)    # far below the 25 GB of fp32 weights
    at.checkbox(key="latency.crossover").set_value(False)
    at.button(key="FormSubmitter:latency.form-Run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.dataframe and len(at.dataframe[0].value) == 1
    assert any("Pi 4 in fp32" in w.value and "would not fit there" in w.value for w in at.warning)
