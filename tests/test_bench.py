"""Timing, memory, sweeps, budgets, the CSV schema and its import checks, and the CLI. No assertion
on how long anything takes: timings on a shared machine are noise; behaviour is not."""
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as hst

from attnviz.base import jobs, timing
from attnviz.latency import calibrate, child, compare, decode, measure, quantize, results, sweep, tradeoff
from attnviz.figures import latency_figures
from attnviz.latency.cli import main
from attnviz.latency import costmodel
from attnviz.weights.catalogue import load_model
from attnviz.core.attention import EAGER, attend, parse_variant
from attnviz.latency.results import config_spec, parse_synthetic, read_results

ROOT = Path(__file__).resolve().parents[1]
TINY = "synthetic:layers=2,d=32,heads=4,ff=64,vocab=50,positions=64"
TINY_CAUSAL = "synthetic:layers=2,d=32,heads=4,kv=2,ff=64,vocab=50,positions=64,causal=1"


def bench_model():
    return measure.load(TINY)


@pytest.fixture(scope="module")
def tiny_results():
    plan = sweep.SweepPlan(models=[TINY, TINY_CAUSAL], seq_lens=[8, 16], variants=["fused", "eager"],
                           heads=[2, 4], threads=[torch.get_num_threads()], backends=["cpu", "pi4"], repeats=2,
                           warmup=1)
    models = {k: measure.load(k) for k in plan.models}
    calls = []
    df = sweep.run_sweep(plan, models, progress=lambda i, n, label: calls.append((i, n)))
    return plan, df, calls


# ---------------------------------------------------------------- shapes
def test_synthetic_specs():
    cfg = parse_synthetic("synthetic:layers=6,d=384,heads=8")
    assert (cfg.family, cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_ff, cfg.causal) == \
        ("bert", 6, 384, 8, 48, 1536, False)
    llama = parse_synthetic("synthetic:layers=2,d=64,heads=4,kv=2,ff=96,causal=1")
    assert llama.family == "llama" and llama.causal and llama.n_kv_heads == 2 and llama.gated_mlp
    assert parse_synthetic("synthetic:family=gpt2,layers=1,d=32,heads=2").causal


@pytest.mark.parametrize("spec,words", [
    ("synthetic:layers=6,d=384", "layers, d and heads are required"),
    ("synthetic:layers=6,d=384,heads=8,colour=red", "unknown keys"),
    ("synthetic:layers=six,d=384,heads=8", "whole numbers"),
    ("synthetic:layers=6,d=100,heads=8", "multiple of heads"),
    ("synthetic:layers=0,d=384,heads=8", "positive"),
    ("synthetic:layers=6,d=384,heads=8,family=rnn", "family must be one of"),
    ("synthetic:layers6,d=384,heads=8", "key=value"),
    ("synthetic:layers=2,d=64,heads=4,kv=3", "multiple of n_kv_heads")])
def test_synthetic_specs_refused_with_a_reason(spec, words):
    with pytest.raises(ValueError, match=words):
        parse_synthetic(spec)


@pytest.mark.parametrize("spec", [TINY, TINY_CAUSAL, "synthetic:family=gpt2,layers=1,d=32,heads=2,vocab=9"])
def test_config_spec_round_trips_what_the_cost_model_needs(spec):
    cfg = parse_synthetic(spec)
    again = parse_synthetic(config_spec(cfg))
    assert again == cfg
    assert costmodel.predict(again, 64, costmodel.PI4).total_ms == costmodel.predict(cfg, 64, costmodel.PI4).total_ms


def test_minilm_shape_in_the_csv_reproduces_its_config():
    import attnviz
    cfg = attnviz.load_model("minilm").cfg
    again = parse_synthetic(config_spec(cfg))
    for field in ("family", "n_layers", "n_heads", "d_model", "d_head", "d_ff", "vocab_size", "norm",
                  "positional", "pre_norm", "causal", "final_norm", "type_vocab_size"):
        assert getattr(again, field) == getattr(cfg, field), field
    assert costmodel.predict(again, 128, costmodel.PI4).total_ms == pytest.approx(costmodel.predict(cfg, 128, costmodel.PI4).total_ms)


# ---------------------------------------------------------------- timing and memory
def test_time_call_statistics_and_threads_restored():
    """Points are timed by the one timer (base.timing), at this process's own thread count."""
    before = torch.get_num_threads()
    calls = []
    t = timing.measure(lambda: calls.append(1), warmup=2, repeats=5)
    assert len(calls) == 7 and len(t.times_ms) == 5
    assert t.p10_ms <= t.median_ms <= t.p90_ms
    model, runs = measure.load(TINY), []
    forward = model.net.forward
    model.net.forward = lambda *a, **k: runs.append(1) or forward(*a, **k)
    point = measure.measure_point(model, 8, parse_variant("fused"), warmup=2, repeats=5, threads=before, memory=False)
    assert len(runs) == 7 and point.tokens == 8 and len(point.timing.times_ms) == 5
    assert point.timing.p10_ms <= point.timing.median_ms <= point.timing.p90_ms and math.isnan(point.peak_mem_mb)
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="repeats"):
        timing.measure(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="clock"):
        timing.measure(lambda: None, clock="sundial")


def test_thread_count_restores_after_an_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        with measure.thread_count(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def test_peak_memory_sees_torch_allocations():
    def allocate():
        x = torch.ones(10 * 2**20 // 4)  # 10 MB
        y = x * 2                        # 10 MB more while x lives
        return float(y[0])
    assert 19.5 <= measure.peak_memory_mb(allocate) < 25


def test_chunked_attention_needs_far_less_memory_than_eager():
    q, k, v = (torch.randn(1, 2, 1024, 32) for _ in range(3))
    naive = measure.peak_memory_mb(lambda: attend(q, k, v, variant=EAGER))
    chunked = measure.peak_memory_mb(lambda: attend(q, k, v, variant=parse_variant("chunked:64")))
    assert naive >= 2 * 2 * 1024 * 1024 * 4 / 2**20 * 0.99  # scores and softmax side by side
    assert chunked <= naive / 8


def test_machine_metadata():
    meta = measure.machine_metadata()
    assert meta["cpu"] and meta["cores"] >= 1 and meta["torch"] == torch.__version__ and meta["arch"]


# ---------------------------------------------------------------- plans and budgets
@pytest.mark.parametrize("change,words", [
    (dict(seq_lens=[0, 16]), "positive"), (dict(seq_lens=[-8]), "positive"), (dict(threads=[0]), "threads|thread"),
    (dict(heads=[0]), "head counts"), (dict(repeats=0), "repeats"), (dict(backends=["gpu"]), "unknown backend"),
    (dict(variants=["bogus"]), "unknown attention variant"), (dict(models=[]), "at least one model"),
    (dict(clock="sundial"), "clock")])
def test_plan_refuses_bad_input(change, words):
    plan = sweep.SweepPlan(**{**dict(models=[TINY], seq_lens=[8]), **change})
    with pytest.raises(ValueError, match=words):
        plan.points({TINY: parse_synthetic(TINY)})


def test_plan_refuses_lengths_beyond_positions_and_too_many_heads():
    cfg = parse_synthetic(TINY)
    with pytest.raises(ValueError, match="beyond .* 64 positions"):
        sweep.SweepPlan(models=[TINY], seq_lens=[65]).points({TINY: cfg})
    with pytest.raises(ValueError, match="cannot keep 5"):
        sweep.SweepPlan(models=[TINY], seq_lens=[8], heads=[5]).points({TINY: cfg})
    rotary = parse_synthetic("synthetic:layers=1,d=32,heads=2,causal=1,positions=64")
    assert len(sweep.SweepPlan(models=["r"], seq_lens=[128]).points({"r": rotary})) == 1  # RoPE extrapolates


def test_budget_refuses_sweeps_that_do_not_fit():
    plan = sweep.SweepPlan(models=["big"], seq_lens=[512, 4096], variants=["eager"], repeats=5)
    configs = {"big": parse_synthetic("synthetic:layers=12,d=768,heads=12,positions=8192")}
    est = sweep.estimate(plan, configs)
    assert est.points == 2 and est.seconds > 0 and est.peak_mb > costmodel.weights_mb(configs["big"])
    with pytest.raises(ValueError, match="budget 1 s"):
        est.check(max_seconds=1, max_mb=None)
    with pytest.raises(ValueError, match="MB of memory"):
        est.check(max_seconds=None, max_mb=100)
    est.check(max_seconds=10**9, max_mb=10**9)  # within budget: no error
    shorter = sweep.estimate(sweep.SweepPlan(models=["big"], seq_lens=[512], variants=["eager"], repeats=5), configs)
    assert shorter.seconds < est.seconds and shorter.peak_mb < est.peak_mb


def test_parse_int_list():
    assert sweep.parse_int_list("16, 32 64", "n") == [16, 32, 64]
    for bad in ("", "16,x", "0", "-4"):
        with pytest.raises(ValueError, match="n must be"):
            sweep.parse_int_list(bad, "n")


# ---------------------------------------------------------------- sweeps
def test_sweep_rows_and_columns(tiny_results):
    plan, df, calls = tiny_results
    assert list(df.columns) == results.COLUMNS
    assert len(df) == 2 * 2 * 2 * 2 * 2  # models x heads x variants x n x backends
    assert calls[-1] == (16, 16) and calls[0] == (0, 16)
    measured = df[df["measured"]]
    assert set(measured["backend"]) == {"cpu"} and set(df[~df["measured"]]["backend"]) == {"pi4"}
    assert (measured["median_ms"] > 0).all() and (measured["peak_mem_mb"] >= 0).all()
    assert ((measured["p10_ms"] <= measured["median_ms"]) & (measured["median_ms"] <= measured["p90_ms"])).all()
    modelled = df[~df["measured"]]
    groups = modelled[[f"{g}_ms" for g in costmodel.GROUPS]].sum(axis=1)
    assert (groups - modelled["median_ms"]).abs().max() < 1e-9
    assert set(df["n_heads"]) == {2, 4} and set(df["variant"]) == {"fused", "eager"}
    assert df["tokens_per_s"].tolist() == pytest.approx((df["seq_len"] / df["median_ms"] * 1e3).tolist())


def test_pruned_rows_are_modelled_with_fewer_heads(tiny_results):
    _, df, _ = tiny_results
    pi = df[(df["backend"] == "pi4") & (df["model"] == TINY) & (df["variant"] == "eager") & (df["seq_len"] == 16)]
    two, four = (pi[pi["n_heads"] == k]["median_ms"].iloc[0] for k in (2, 4))
    assert two < four


def test_csv_round_trip(tiny_results, tmp_path):
    _, df, _ = tiny_results
    text = results.to_csv(df)
    back = read_results(text.encode())
    assert list(back.columns) == results.COLUMNS and len(back) == len(df)
    pd.testing.assert_series_equal(back["median_ms"], df["median_ms"], check_exact=False, rtol=1e-12)
    assert back["measured"].tolist() == df["measured"].tolist()
    path = tmp_path / "r.csv"
    path.write_text(text)
    assert len(read_results(path)) == len(df) == len(read_results(str(path)))


def test_modelled_like_and_model_error(tiny_results):
    _, df, _ = tiny_results
    measured = df[df["measured"]]
    modelled = compare.modelled_like(measured, costmodel.PI4)
    assert len(modelled) == len(measured) and not modelled["measured"].any()
    err = compare.model_error(df, costmodel.PI4)
    assert len(err) == len(measured)
    assert (err["modelled_ms"] / err["measured_ms"] - 1).mul(100).sub(err["error_pct"]).abs().max() < 1e-9
    pi = df[df["backend"] == "pi4"].assign(measured=True)  # the model against itself: no error
    assert compare.model_error(pi, costmodel.PI4)["error_pct"].abs().max() < 1e-9


def test_recalibration_from_a_device_csv(tiny_results):
    """A 'Pi' that runs everything 3x slower than the pi4 profile: the fitted profile predicts it."""
    _, df, _ = tiny_results
    device = df[df["backend"] == "pi4"].assign(measured=True, backend="cpu")
    device["median_ms"] = device["p10_ms"] = device["p90_ms"] = device["median_ms"] * 3
    back = read_results(results.to_csv(device).encode())
    fitted = compare.recalibrate_from(back, costmodel.PI4)
    assert compare.model_error(back, fitted)["error_pct"].abs().max() < 1.0
    assert compare.model_error(back, costmodel.PI4)["error_pct"].abs().max() > 60


def test_host_model_error_and_split_table(tiny_results):
    _, df, _ = tiny_results
    err = compare.host_model_error(df)
    assert len(err) == int(df["measured"].sum()) and err["modelled_ms"].gt(0).all()
    split = compare.split_table(parse_synthetic(TINY), [8, 16], costmodel.PI5, "eager")
    assert list(split.columns) == ["seq_len"] + [f"{g}_ms" for g in costmodel.GROUPS]
    assert split.drop(columns="seq_len").sum(axis=1).tolist() == pytest.approx(
        [costmodel.predict(parse_synthetic(TINY), n, costmodel.PI5, "eager").total_ms for n in (8, 16)])


def test_comparisons(tiny_results):
    _, df, _ = tiny_results
    cmp = compare.seed_claims(df)
    assert {"n 16 → 8", "4 → 2 heads", "fused → eager"} <= set(cmp["comparison"])
    row = cmp[(cmp["comparison"] == "n 16 → 8") & (cmp["backend"] == "pi4") & (cmp["model"] == TINY)
              & (cmp["variant"] == "fused") & (cmp["n_heads"] == 4)]
    pi = df[(df["backend"] == "pi4") & (df["model"] == TINY) & (df["variant"] == "fused") & (df["n_heads"] == 4)]
    t = pi.set_index("seq_len")["median_ms"]
    assert row["speedup"].iloc[0] == pytest.approx(t[16] / t[8])


# ---------------------------------------------------------------- malformed CSV
def good_csv(tiny_results) -> str:
    return results.to_csv(tiny_results[1])


@pytest.mark.parametrize("mutate,words", [
    (lambda t: "", "empty"),
    (lambda t: "name,age\nann,3\n", "not written by `python -m attnviz.bench`: missing columns backend"),
    (lambda t: t.replace(",cpu,True,", ",cpu,perhaps,", 1), "column 'measured'"),
    (lambda t: t.replace(",fused,8,", ",fused,eight,", 1), "row 2, column 'seq_len'"),
    (lambda t: t.replace(",fused,8,", ",fused,-8,", 1), "column 'seq_len'"),
    (lambda t: t.replace(",fused,8,", ",fused,8.5,", 1), "whole number"),
    (lambda t: t.replace(",fused,", ",warp-drive,", 1), "column 'variant'"),
    (lambda t: t.replace("synthetic:family=bert", "synthetic:family=rnn", 1), "column 'shape'"),
    (lambda t: t.replace("attnviz-bench/1", "attnviz-bench/9", 1), "unsupported schema"),
])
def test_malformed_csv_is_refused_with_a_clear_error(tiny_results, mutate, words):
    with pytest.raises(ValueError, match=words):
        read_results(mutate(good_csv(tiny_results)).encode())


def test_csv_with_inverted_percentiles_binary_or_huge_is_refused(tiny_results):
    df = tiny_results[1].copy()
    df.loc[0, "p10_ms"] = df.loc[0, "median_ms"] * 2
    with pytest.raises(ValueError, match="p10_ms <= median_ms <= p90_ms"):
        read_results(results.to_csv(df).encode())
    with pytest.raises(ValueError, match="not a readable CSV|not written by"):
        read_results(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    with pytest.raises(ValueError, match="larger than"):
        read_results(b"x" * (results.MAX_CSV_BYTES + 1))


# ---------------------------------------------------------------- CLI
def cli(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "attnviz.bench", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=240)


def test_cli_help():
    out = cli("--help")
    assert out.returncode == 0
    for flag in ("--model", "--seq-lens", "--variants", "--heads", "--threads", "--repeats", "--warmup",
                 "--backend", "--out", "--engine", "--dtype", "--pi-threads", "--decode-depths"):
        assert flag in out.stdout
    for word in ("ncnn", "ggml", "int8", "fp16", "q4_0", "pp", "tg"):  # engines and dtypes documented
        assert word in out.stdout


def test_cli_writes_the_published_runs_with_their_predictions(tmp_path):
    """`--published` writes every published Pi run, the model's prediction and error."""
    out_file = tmp_path / "runs.csv"
    out = cli("--published", "--out", str(out_file))
    assert out.returncode == 0, out.stderr
    runs = pd.read_csv(out_file)
    assert len(runs) >= 30 and (runs["error_pct"].abs() <= 25).all()
    assert {"fit", "check"} <= set(runs["role"]) and runs["source"].str.contains("github.com|justine.lol").all()
    assert "--published" in cli("--help").stdout


def test_cli_tiny_sweep_writes_a_csv_the_page_reads(tmp_path):
    out_file = tmp_path / "pi.csv"
    out = cli("--model", TINY, "--seq-lens", "8,16", "--variants", "fused,chunked:4,linear", "--heads", "2,4",
              "--threads", "1", "--repeats", "2", "--warmup", "0", "--backend", "cpu,pi5", "--no-crossover",
              "--out", str(out_file))  # the one-block crossover rows (--crossover): tests/test_crossover.py
    assert out.returncode == 0, out.stderr
    df = read_results(out_file)
    assert len(df) == 2 * 3 * 2 * 2 and set(df["backend"]) == {"cpu", "pi5"}
    assert set(df["variant"]) == {"fused", "chunked:4", "linear"} and (df[df["measured"]]["threads"] == 1).all()
    assert (df[~df["measured"]]["threads"] == sweep.PI_CORES).all()  # Pi rows at the Pi's 4 cores
    assert "wrote 24 rows" in out.stderr and "profiler_start" not in out.stderr


MOBILEBERT = "synthetic:layers=24,d=512,bottleneck=128,heads=4,ff=512,ffns=4"


def test_cli_prices_every_shape_the_cost_model_prices(tmp_path, capsys):
    """The CLI answered "unknown keys ['bottleneck', 'ffns']" for a MobileBERT the library prices; an
    explicit-FLOP network (gflops, mparams, calls) is priced, too. Both are modelled, never measured."""
    from attnviz.latency import engines, shapes
    out_file = tmp_path / "mobilebert.csv"
    assert main(["--model", MOBILEBERT, "--backend", "pi4", "--seq-lens", "128", "--out", str(out_file)]) == 0
    row = pd.read_csv(out_file).iloc[0]
    assert (row["backend"], row["model"], row["seq_len"], row["measured"]) == ("pi4", MOBILEBERT, 128, False)
    pi4 = engines.engine_profile(costmodel.PI4, "torch", "fp32")
    assert row["median_ms"] == pytest.approx(costmodel.predict(shapes.parse_shape(MOBILEBERT), 128, pi4, "fused",
                                                        threads=4).total_ms)
    flop = "synthetic:gflops=8.2,mparams=25.6,calls=200"
    assert main(["--model", flop, "--model", MOBILEBERT, "--backend", "pi4,pi5", "--engine", "torch,ncnn",
                           "--seq-lens", "1,64", "--out", str(out_file)]) == 0
    df = pd.read_csv(out_file)
    assert len(df) == 2 * 2 * 2 * 2 and set(df["model"]) == {flop, MOBILEBERT} and not df["measured"].any()
    with pytest.raises(SystemExit) as exit_:                       # nothing to measure: said, not a traceback
        main(["--model", MOBILEBERT, "--seq-lens", "8"])
    assert exit_.value.code == 2 and "priced by the cost model only" in capsys.readouterr().err


@pytest.mark.parametrize("args,words", [
    (("--seq-lens", "0,16"), "positive"),
    (("--model", TINY, "--seq-lens", "100"), "beyond"),
    (("--model", "synthetic:layers=2", "--seq-lens", "8"), "required"),
    (("--model", TINY, "--seq-lens", "8", "--backend", "tpu"), "unknown backend"),
    (("--model", "synthetic:layers=24,d=4096,heads=32", "--seq-lens", "4096", "--max-mem-mb", "100"), "budget"),
])
def test_cli_refuses_bad_input(args, words, capsys):
    with pytest.raises(SystemExit) as exit_:  # in process: the subprocess start-up is tested above
        main(list(args))
    assert exit_.value.code == 2 and words in capsys.readouterr().err


# ---------------------------------------------------------------- bounds (: synthetic shapes, CSV rows)
@pytest.mark.parametrize("spec,words", [
    ("synthetic:layers=1000000000,d=8,heads=1", "layers must be between 1 and 256"),
    ("synthetic:layers=2,d=1000000,heads=1", "d must be between 1 and 16,384"),
    ("synthetic:layers=2,d=4096,heads=4096", "heads must be between 1 and 256"),
    ("synthetic:layers=2,d=64,heads=4,dh=100000", "dh must be between 1 and 1,024"),
    ("synthetic:layers=2,d=64,heads=4,ff=99999999", "ff must be between 1 and 65,536"),
    ("synthetic:layers=2,d=64,heads=4,vocab=99999999999", "vocab must be between 0 and 1,000,000"),
    ("synthetic:layers=2,d=64,heads=4,vocab=0", "vocab must be between 1"),
    ("synthetic:layers=2,d=64,heads=4,positions=99999999999", "positions must be between 1"),
    ("synthetic:layers=2,d=64,heads=4,causal=7", "causal must be between 0 and 1"),
    ("synthetic:layers=-3,d=64,heads=4", "layers must be between 1 and 256"),
    ("synthetic:layers=2,d=64,heads=4,kv=8", "kv must divide heads"),
    ("synthetic:layers=2,d=64,heads=4," + "x" * 400, "longer than 300 characters")])
def test_every_field_of_a_synthetic_spec_is_bounded(spec, words):
    with pytest.raises(ValueError, match=words):
        parse_synthetic(spec)


def test_largest_allowed_shape_is_still_accepted():
    cfg = parse_synthetic("synthetic:layers=256,d=16384,heads=128,kv=8,ff=65536,vocab=1000000,causal=1")
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads) == (256, 16384, 128, 8)


def test_cost_model_does_not_loop_over_identical_layers():
    """One entry per run of identical layers: a 200-layer model costs as much to model as a 1-layer
    one, and adds up to 200 of its blocks."""
    def shape(layers):
        return parse_synthetic(f"synthetic:layers={layers},d=64,heads=4,ff=128,vocab=50,positions=64")
    one, deep = costmodel.predict(shape(1), 32, costmodel.PI4, "eager"), costmodel.predict(shape(200), 32, costmodel.PI4, "eager")
    assert len(deep.ops) == len(one.ops)
    block = costmodel.predict(shape(2), 32, costmodel.PI4, "eager").total_ms - one.total_ms
    assert deep.total_ms == pytest.approx(one.total_ms + 199 * block)
    assert sum(op.flops for op in costmodel.model_ops(shape(200), 32)) == pytest.approx(
        costmodel.predict(shape(200), 32, costmodel.PI4).flops)
    pruned = shape(4).replace(head_dims=(4, 4, 2, 2), kv_dims=(4, 4, 2, 2))  # two runs of two layers
    assert [count for _, count in costmodel.op_counts(pruned, 8) if _.name == "QKV projection"] == [2, 2]


@pytest.mark.parametrize("change,words", [
    (dict(seq_lens=[1 << 20]), "at most 131,072 tokens"), (dict(threads=[10**6]), "at most 1024"),
    (dict(repeats=10**6), "repeats must be at most"),
    (dict(seq_lens=list(range(1, 6001))), "at most 5,000")])
def test_plan_bounds_are_checked_before_any_work(change, words):
    plan = sweep.SweepPlan(**{**dict(models=[TINY], seq_lens=[8]), **change})
    with pytest.raises(ValueError, match=words):
        plan.check()


def test_a_row_with_an_extra_field_is_a_row_and_column_error(tiny_results):
    lines = good_csv(tiny_results).splitlines()
    last = results.COLUMNS[-1]  # the schema grew compatibly: its last column is the decode field
    with pytest.raises(ValueError, match=rf"row 4, column {len(results.COLUMNS) + 1} \(past the header's last "
                                         rf"column '{last}'\)"):
        read_results("\n".join(lines[:3] + [lines[3] + ",surplus"] + lines[4:]).encode())
    with pytest.raises(ValueError, match=rf"row 3, column '{last}': missing"):
        read_results("\n".join(lines[:2] + [lines[2].rsplit(",", 1)[0]] + lines[3:]).encode())
    # a header one name short: every row has one field too many (with a bad value: a TypeError before)
    with pytest.raises(ValueError, match=rf"row 2, column {len(results.COLUMNS)}"):
        read_results("\n".join([lines[0].removeprefix("schema,")] + lines[1:]).replace(",fused,8,", ",fused,x,")
                     .encode())


def test_csv_values_are_bounded_per_row(tiny_results):
    df = tiny_results[1]
    for col, value, words in (("seq_len", 10**9, "column 'seq_len': must be at most 131,072"),
                              ("threads", 10**7, "column 'threads': must be at most 1,024"),
                              ("n_heads", 200, "column 'n_heads': must be at most the shape's 4 heads"),
                              ("shape", "synthetic:layers=1000000000,d=8,heads=1", "column 'shape'.*layers must")):
        bad = df.copy()
        bad[col] = bad[col].astype(object)
        bad.loc[3, col] = value
        with pytest.raises(ValueError, match=rf"row 5, {words}"):
            read_results(results.to_csv(bad).encode())


CELLS = ["", "x", "nan", "inf", "-1", "1e400", "'=1", "=1", '"a,b"', "True", "0", "1.5", "é", ",", '"', "\n",
         "synthetic:layers=1000000000,d=8,heads=1", "local:0", "chunked:0", "synthetic:layers=2,d=8,heads=1,vocab=0"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=hst.lists(hst.tuples(hst.integers(0, 10**6), hst.integers(0, 10**6),
                                 hst.sampled_from(["insert", "delete", "set"]),
                                 hst.one_of(hst.sampled_from(CELLS), hst.text(max_size=12))), min_size=1, max_size=3))
@example(edits=[(0, 0, "delete", ""), (2, 2, "set", "x")])  # header one name short, a bad value: a TypeError before
@example(edits=[(2, 9, "insert", "x")])  # a field too many in a row
def test_any_mangled_csv_is_a_value_error(tiny_csv_lines, edits):
    """Property: whatever is inserted, deleted or changed, read_results answers with a table or a
    ValueError, never another exception; a field too many or too few names its row and column."""
    lines = list(tiny_csv_lines)
    for row, col, op, text in edits:
        i = row % len(lines)
        cells = lines[i].split(",")
        j = col % (len(cells) + (op == "insert"))
        if op == "insert":
            cells.insert(j, text)
        elif op == "delete" and len(cells) > 1:
            del cells[j]
        else:
            cells[j % len(cells)] = text
        lines[i] = ",".join(cells)
    try:
        read_results("\n".join(lines).encode("utf-8", "surrogatepass"))
    except ValueError as err:
        if "fields but the header names" in str(err) or "missing (" in str(err):
            assert re.match(r"row \d+, column ", str(err)), str(err)


@pytest.fixture(scope="module")
def tiny_csv_lines(tiny_results):
    return results.to_csv(tiny_results[1]).splitlines()


# ---------------------------------------------------------------- exports are safe to open, and read back
def test_exported_csv_neutralises_formulas_and_reads_back(tiny_results):
    df = tiny_results[1].copy()
    df["model"] = df["model"].astype(object)
    df.loc[0, "model"], df.loc[1, "model"] = '=HYPERLINK("http://evil.example","x")', "-2+3"
    df["cpu"] = "@SUM(1)"
    text = results.to_csv(df)
    cells = [c for line in text.splitlines()[1:] for c in line.split(",")]
    assert not any(c.startswith(("=", "+", "@")) or c.startswith('"=') for c in cells)
    assert "'=HYPERLINK" in text and "'-2+3" in text and "'@SUM(1)" in text
    back = read_results(text.encode())
    assert back.loc[0, "model"] == df.loc[0, "model"] and back.loc[1, "model"] == "-2+3"
    assert (back["cpu"] == "@SUM(1)").all()
    pd.testing.assert_series_equal(back["median_ms"], df["median_ms"], check_exact=False, rtol=1e-12)
    assert back["seq_len"].dtype.kind == "i" and back["median_ms"].dtype.kind == "f"


# ---------------------------------------------------------------- threads and deadlines
@pytest.fixture
def no_thread_changes(monkeypatch):
    """torch.set_num_threads is process-wide: a shared process must never call it."""
    def refuse(n):
        raise AssertionError(f"torch.set_num_threads({n}) called in a shared process")
    monkeypatch.setattr(torch, "set_num_threads", refuse)


def other_threads() -> int:
    return 1 if torch.get_num_threads() != 1 else 2


def test_other_thread_counts_are_measured_in_a_child_process(no_thread_changes):
    before, other = torch.get_num_threads(), other_threads()
    plan = sweep.SweepPlan(models=[TINY], seq_lens=[8, 16], threads=[before, other], backends=["cpu", "pi4"],
                           repeats=1, warmup=0, memory=False)
    df = sweep.run_sweep(plan, {TINY: measure.load(TINY)}, deadline=jobs.Deadline(600, "the sweep"))
    assert torch.get_num_threads() == before and df.attrs["stopped"] == ""
    measured = df[df["measured"]]
    assert sorted(measured["threads"]) == sorted([before, before, other, other])
    assert (measured["model"] == TINY).all() and (measured["shape"] == config_spec(parse_synthetic(TINY))).all()
    # the Pi rows once per point at the Pi's own 4 threads, whatever this host runs
    assert len(df[~df["measured"]]) == 2 and (df[~df["measured"]]["threads"] == sweep.PI_CORES).all()
    with pytest.raises(ValueError, match="thread"):
        measure.measure_point(bench_model(), 8, parse_variant("fused"), threads=other)
    with pytest.raises(ValueError, match="thread"):
        calibrate.calibrate_host(threads=other, quick=True)


def test_host_profile_at_another_thread_count_comes_from_a_child(no_thread_changes):
    before, other = torch.get_num_threads(), other_threads()
    prof = calibrate.host_profile(other, "cpu")
    assert prof.threads == other and prof.gemm_gflops > 0 and torch.get_num_threads() == before


class StopsAfter(jobs.Deadline):
    """A deadline that expires after n checks: the sweep's behaviour, not the clock, is tested."""

    def __init__(self, n):
        super().__init__(600, "the sweep")
        self.left = n

    def expired(self):
        self.left -= 1
        return self.left < 0


def test_sweep_stops_at_its_deadline_and_keeps_what_it_measured():
    plan = sweep.SweepPlan(models=[TINY], seq_lens=[8, 16, 32], backends=["cpu", "pi4"], repeats=1, warmup=0,
                           memory=False)
    df = sweep.run_sweep(plan, {TINY: measure.load(TINY)}, deadline=StopsAfter(4))
    assert "stopped at its time limit" in df.attrs["stopped"] and "kept the 2 measured points" in df.attrs["stopped"]
    assert df["measured"].sum() == 2 and list(df["seq_len"][df["measured"]]) == [8, 16]
    assert len(read_results(results.to_csv(df).encode())) == len(df)
    nothing = sweep.run_sweep(plan, {TINY: measure.load(TINY)}, deadline=jobs.Deadline(0, "the sweep"))
    # every modelled row comes first and is kept; nothing is measured, and what was not is said
    assert not nothing["measured"].any() and len(nothing) == 3 and "kept the 0 measured points" in nothing.attrs["stopped"]
    assert "not measured:" in nothing.attrs["stopped"] and "n=8" in nothing.attrs["stopped"]


def test_cli_deadline_writes_what_it_measured_and_says_it_stopped(tmp_path):
    out_file = tmp_path / "r.csv"
    out = cli("--model", TINY, "--seq-lens", "8,16", "--threads", "1", "--deadline", "0", "--out", str(out_file))
    assert out.returncode == child.STOPPED_EXIT and "stopped: the sweep stopped at its time limit" in out.stderr
    assert out_file.read_text().startswith("schema,backend")


# ---------------------------------------------------------------- one model name per row
def test_figures_of_a_csv_with_a_model_per_row_draw_a_bounded_number_of_traces(tiny_results):
    device = tiny_results[1]
    device = device[device["backend"] == "pi4"].assign(measured=True, backend="cpu")
    many = pd.concat([device.assign(model=[f"{m}#{i}" for m in device["model"]]) for i in range(100)],
                     ignore_index=True)  # 1,600 rows, 200 distinct model names
    back = read_results(results.to_csv(many).encode())
    twins = compare.modelled_like(back, costmodel.PI4)
    fig = latency_figures.overlay_figure(back, twins, "overlay")
    assert latency_figures.series_count(back) == 200 * 2 * 2     # models x heads x variants
    assert len(fig.data) == 2 * (latency_figures.MAX_SERIES + 1)
    shown = [t for t in fig.data if t.name.endswith("measured")]
    assert sum(int(np.isfinite(np.asarray(t.y, dtype=float)).sum()) for t in shown) == len(back)
    assert f"{latency_figures.MAX_SERIES} of 800 series drawn" in fig.layout.title.text
    for figure in (latency_figures.latency_figure(back), latency_figures.memory_figure(back), latency_figures.throughput_figure(back),
                   latency_figures.error_figure(compare.model_error(back, costmodel.PI4, twins))):
        assert len(figure.data) <= latency_figures.MAX_SERIES + 2 and "series drawn" in figure.layout.title.text
    small = back[back["model"].isin(back["model"].unique()[:2])]
    assert "series drawn" not in latency_figures.latency_figure(small).layout.title.text  # 8 series: drawn one by one


# ---------------------------------------------------------------- absurd numbers
@pytest.mark.parametrize("ms", ["1e308", "1e-308", "0", "nan", "inf"])
def test_absurd_times_in_a_csv_are_a_row_and_column_error(tiny_results, ms):
    df = tiny_results[1].copy()
    df.loc[2, ["median_ms", "p10_ms", "p90_ms"]] = float(ms)
    with pytest.raises(ValueError, match=r"row 4, column 'median_ms': must be"):
        read_results(results.to_csv(df).encode())


@pytest.mark.parametrize("ms", [1e308, 1e-308, float("nan"), float("inf"), -1.0])
def test_recalibration_refuses_absurd_times_without_lapack_noise(ms, capfd):
    cfg = parse_synthetic(TINY)
    points = [(cfg, 8, "fused", 4, 5.0), (cfg, 16, "fused", 4, ms), (cfg, 32, "fused", 4, 12.0)]
    with pytest.raises(ValueError, match="not a forward pass's"):
        calibrate.recalibrate(costmodel.PI4, points)
    assert capfd.readouterr().err == ""


def test_recalibration_refuses_a_fit_beyond_any_device():
    cfg = parse_synthetic(TINY)
    points = [(cfg, n, "fused", 4, costmodel.predict(cfg, n, costmodel.PI4, threads=4).total_ms * 1e6) for n in (8, 16, 32)]
    with pytest.raises(ValueError, match="beyond any real device"):
        calibrate.recalibrate(costmodel.PI4, points)
    slower = calibrate.recalibrate(costmodel.PI4, [(c, n, v, t, ms / 1e4 * 3) for c, n, v, t, ms in points])
    assert slower.overhead_us < 1e6 and all(math.isfinite(x) for x in (slower.gemm_gflops, slower.overhead_us))


@pytest.mark.parametrize("field", ["overhead_us", "gemm_gflops", "dram_gbs"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0.0, -1.0, 1e300])
def test_a_profile_with_an_absurd_figure_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        costmodel.DeviceProfile(**{**costmodel.PI4.__dict__, field: value})


@pytest.mark.parametrize("flag", ["--max-seconds", "--max-mem-mb", "--deadline"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_cli_refuses_non_finite_budgets(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--model", TINY, "--seq-lens", "8", flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and flag in err and repr(value) in err


@pytest.mark.parametrize("budget", [float("nan"), float("inf"), 0.0, -5.0])
def test_library_budgets_must_be_finite_and_positive(budget):
    est = sweep.Estimate(seconds=10.0, peak_mb=100.0, points=1)
    with pytest.raises(ValueError, match="time budget"):
        est.check(budget, None)
    with pytest.raises(ValueError, match="memory budget"):
        est.check(None, budget)
    plan = sweep.SweepPlan(models=[TINY], seq_lens=[8], repeats=1, warmup=0, memory=False)
    if budget == 0.0:  # a deadline of 0 s is a deadline (it stops at once); NaN would never stop
        assert sweep.run_sweep(plan, {TINY: bench_model()}, deadline=jobs.Deadline(budget)).attrs["stopped"]
    else:
        with pytest.raises(ValueError, match="deadline"):
            sweep.run_sweep(plan, {TINY: bench_model()}, deadline=jobs.Deadline(budget))


# ---------------------------------------------------------------- quantization, decode
def test_int8_and_bf16_copies_are_new_models_the_shared_one_untouched():
    model = measure.load("synthetic:layers=2,d=32,heads=4,ff=64,vocab=50,positions=64,causal=1")
    before = model.fingerprint()
    ids = torch.arange(12)[None] % 50
    with torch.inference_mode():
        ref = model.net(input_ids=ids, logits=True).logits
    for mode in quantize.MODES:
        twin = quantize.quantized_copy(model, mode)
        assert twin is not model and twin.net is not model.net and mode in twin.info.key
        layers = [m for m in twin.net.modules() if isinstance(m, quantize.QuantLinear)]
        assert layers and all(m.mode == mode for m in layers)
        assert not any(isinstance(m, quantize.QuantLinear) for m in model.net.modules())
        with torch.inference_mode():
            got = twin.net(input_ids=ids, logits=True).logits
        assert torch.nn.functional.cosine_similarity(ref.flatten(), got.flatten(), 0) > 0.98
    assert model.fingerprint() == before
    with pytest.raises(ValueError, match="mode"):
        quantize.quantize_net(model.net, "int4")


def test_quantized_translator_translates_through_its_quantized_layers():
    """A translator's int8 / bf16 copy decodes through its quantized layers: its SSRU products and the
    one-row fast path (which read the float weights directly) give way to the layers' own calls, and its
    shortlisted output layer reads the (dequantized) weights and bias; the shared model keeps the fast path."""
    model = load_model("en-pt")
    text = model.translate("The weather is nice today.").text
    src = model.source("The weather is nice today.")[0][None]
    with torch.inference_mode():
        memory = model.net.encode(src)[0]
    assert model.net.row_state(memory) is not None and model.net.decoder[0].ssru.plain()
    for mode in quantize.MODES:
        twin = quantize.quantized_copy(model, mode)
        assert twin.translate("The weather is nice today.").text == text
        head = twin.net.lm_head
        assert head.weight.shape == model.net.lm_head.weight.shape and head.bias.shape == model.net.lm_head.bias.shape
        with torch.inference_mode():
            memory = twin.net.encode(src)[0]
            assert twin.net.row_state(memory) is None and twin.net.row_state(memory, twin.net.start(memory)) is None
        assert not twin.net.decoder[0].ssru.plain()
    assert model.translate("The weather is nice today.").text == text


def test_int8_sensitivity_leaves_each_kind_of_linear_layer_float32_in_turn():
    """Which layers int8 hurts: one row with everything int8, then one per kind left float32; keeping
    a kind leaves exactly that kind's layers float32 (and its share of the weights is reported)."""
    model = measure.load("synthetic:layers=2,d=32,heads=4,ff=64,vocab=50,positions=64,causal=1")
    before = model.fingerprint()
    kinds = quantize.linear_kinds(model.net)
    assert {"qkv", "out", "fc_in", "fc_out"} <= set(kinds)
    table = quantize.sensitivity(model)
    assert list(table["float32_kept"]) == ["none", *kinds] and table.iloc[0]["float32_weight_share"] == 0
    assert 0 < table.iloc[1:]["float32_weight_share"].sum() <= 1.0 + 1e-9
    assert (table["KL (nats/token)"] >= 0).all() and table["top-1 agreement"].between(0, 1).all()
    twin = quantize.quantized_copy(model, "int8", keep=("fc_out",))
    for name, module in twin.net.named_modules():
        if name.endswith("fc_out"):
            assert isinstance(module, torch.nn.Linear)
        elif name.endswith("fc_in"):
            assert isinstance(module, quantize.QuantLinear)
    assert "fc_out float32" in twin.info.key and model.fingerprint() == before
    with pytest.raises(ValueError, match="no linear layers named"):
        quantize.quantized_copy(model, "int8", keep=("conv",))
    cancel = jobs.Cancel(reason="the browser session has gone")
    cancel.set()
    with pytest.raises(jobs.JobCancelled, match="gone"):
        quantize.sensitivity(model, check=cancel.check)


def test_int8_attention_probabilities_relu_survives_better_than_softmax():
    """The seed's experiment on MiniLM: 8-bit probabilities flush softmax's long tail; ReLU's zeros are exact."""
    table = quantize.probabilities_int8(load_model("minilm")).set_index("variant")
    assert table.loc["relu", "flushed_share"] < table.loc["softmax", "flushed_share"]
    assert table.loc["relu", "l1_per_row"] < table.loc["softmax", "l1_per_row"]
    assert (table["mass_lost"] >= 0).all() and (table["l1_per_row"] <= 2).all()


def test_decode_measured_with_the_kv_cache_matches_a_full_rerun():
    """One decode step at depth d from the cache gives the last logits of a full pass over d + 1 tokens."""
    model = measure.load("synthetic:layers=2,d=32,heads=4,kv=2,ff=64,vocab=50,positions=64,causal=1")
    point = decode.measure_decode(model, n_prompt=8, depth=6, repeats=2, warmup=0)
    assert point.n_prompt == 8 and point.depth == 6 and len(point.step.times) == 2
    assert point.pp_tps > 0 and point.tg_tps > 0
    net = model.net
    ids = torch.randint(0, 50, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        cache = [{} for _ in range(2)]
        net.run_blocks(net.embed_text(ids[:, :6]), cache=cache)
        step = net.finish(net.run_blocks(net.embed_text(ids[:, 6:], offset=6), cache=cache, offset=6).x)[1]
        full = net(input_ids=ids, logits=True).logits
    assert torch.allclose(step[0, -1], full[0, -1], atol=1e-4)
    with pytest.raises(ValueError, match="causal"):
        decode.measure_decode(measure.load(TINY), 4, 2)


def test_decode_sweep_rows_and_figure():
    plan = sweep.SweepPlan(models=[TINY_CAUSAL, TINY], seq_lens=[8], backends=["cpu", "pi5"], repeats=1, warmup=0,
                           memory=False, engines=["ggml"], dtypes=["fp16", "q4_0"])
    models = {k: measure.load(k) for k in plan.models}
    df = decode.decode_sweep(plan, models, [0, 16], n_prompt=8)
    assert set(df["model"]) == {TINY_CAUSAL}  # encoders have no decode
    pi = df[~df["measured"]]
    assert len(pi) == 2 * 3 and set(pi["dtype"]) == {"fp16", "q4_0"} and (pi["threads"] == sweep.PI_CORES).all()
    assert len(df[df["measured"]]) == 3 and set(df["test"]) == {"pp", "tg"}
    back = read_results(results.to_csv(df).encode())
    assert list(back["depth"].dropna().astype(int)) == list(df["depth"].astype(int))
    assert (back["tg_tps"].notna() == (back["test"] == "tg")).all()
    fig = latency_figures.decode_figure(back)
    assert len(fig.data) == 3 and list(fig.data[0].x) == [0, 16]


def test_old_csv_without_engine_columns_still_imports():
    lines = ["backend,measured,model,shape,variant,seq_len,n_heads,threads,median_ms,p10_ms,p90_ms,peak_mem_mb,cpu,torch",
             f"cpu,true,m,\"{config_spec(parse_synthetic(TINY))}\",fused,8,4,1,1.0,0.9,1.1,,x86,2.0"]
    df = read_results("\n".join(lines).encode())
    assert df["engine"].tolist() == ["torch"] and df["dtype"].tolist() == ["fp32"] and df["test"].tolist() == [""]
    bad = "\n".join([lines[0] + ",engine,dtype", lines[1] + ",ncnn,q4_0"])
    with pytest.raises(ValueError, match="row 2, column 'engine'"):
        read_results(bad.encode())


def test_growth_figure_shows_the_law_and_fit_uses_scientific_notation(tiny_results):
    _, df, _ = tiny_results
    fig = latency_figures.growth_figure(df)
    ns = sorted(df["seq_len"].unique())
    assert list(fig.layout.xaxis.tickvals) == ns  # ticks at the swept lengths
    refs = [t for t in fig.data if t.name in ("slope 1", "slope 2")]
    assert {t.name for t in refs} == {"slope 1", "slope 2"}
    one = next(t for t in refs if t.name == "slope 1")
    two = next(t for t in refs if t.name == "slope 2")
    ratio = ns[-1] / ns[0]
    assert one.y[1] / one.y[0] == pytest.approx(ratio) and two.y[1] / two.y[0] == pytest.approx(ratio ** 2)
    assert len(fig.layout.annotations) == df["backend"].nunique()  # one panel per backend
    ns_fit = [16, 32, 64, 128]
    fit = latency_figures.fit_figure(ns_fit, [1 + 0.01 * n + 2e-6 * n * n for n in ns_fit], attention_n=5000)
    assert "e-06·n²" in fit.data[1].name and "beyond the swept lengths" in fit.layout.title.text
    assert fit.layout.xaxis.range[1] < 200  # cropped to the data, not stretched to the crossover


def test_attention_only_rows_are_quadratic_in_the_model():
    cfg = parse_synthetic(TINY)
    att = compare.attention_only(cfg, [64, 128, 256], costmodel.PI4, "eager", measure_fn=measure.measure_attention)
    model = att[~att["measured"]].set_index("seq_len")["median_ms"]
    assert model[256] / model[128] > 3  # n^2 dominates one layer's attention
    assert att["measured"].sum() == 3 and (att["median_ms"] > 0).all()


def test_four_vs_eight_heads_table_on_the_pi():

    table = tradeoff.heads_table().set_index(["shape", "n_heads"])
    assert len(table) == 4 and set(table.index.get_level_values("n_heads")) == {4, 8}
    toys = table.loc[["toy-recall", "toy-recall-8h"]]
    assert (toys["d_model"] == 64).all() and toys["exact_accuracy"].between(0, 1).all()
    for device in ("pi4", "pi5"):
        ms = table[f"{device} torch fp32 ms"]
        assert (ms > 0).all()
        # equal d_model: 8 narrower heads cost at least as much as 4 (more per-head work), never 2x
        four, eight = ms.xs(4, level="n_heads").iloc[-1], ms.xs(8, level="n_heads").iloc[-1]
        assert four <= eight < 2 * four
    assert (table["pi4 torch fp32 ms"] > table["pi5 torch fp32 ms"]).all()
