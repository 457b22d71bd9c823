"""The attention = rest crossover of ONE block, measured and modelled, in the sweep, the
CSV, the CLI and the figure; and (19.3) int8 / bf16 as measured rows of the sweep."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

from attnviz.base import jobs
from attnviz.core.attention import parse_variant
from attnviz.figures.crossover_figures import crossover_figure
from attnviz.latency import cli
from attnviz.latency import costmodel
from attnviz.latency import crossover
from attnviz.latency import measure, results, sweep
from attnviz.latency.results import parse_synthetic, read_results

TINY = "synthetic:layers=2,d=32,heads=4,ff=64,vocab=50,positions=64"
ROPE = "synthetic:family=llama,layers=2,d=32,heads=4,kv=2,ff=64,vocab=50,positions=64,causal=1"
MINILM = parse_synthetic("synthetic:layers=6,d=384,heads=12,ff=1536,vocab=30522,positions=512")


def test_block_crossover_is_where_attention_equals_the_rest_of_one_block():
    n = crossover.block_crossover(MINILM, costmodel.PI4, "eager")
    split = crossover.block_split(MINILM, n, costmodel.PI4, "eager")
    before = crossover.block_split(MINILM, int(n * 0.97), costmodel.PI4, "eager")
    assert split["attention"] >= sum(split.values()) - split["attention"]
    assert before["attention"] < sum(before.values()) - before["attention"]
    # the whole model adds per-token rest (embeddings, norms): it crosses no earlier than one block
    assert costmodel.attention_crossover(MINILM, costmodel.PI4, "eager") >= n * 0.98
    assert crossover.block_crossover(MINILM, costmodel.PI4, "linear") is None
    ns = crossover.lengths(n)
    assert min(ns) < n < max(ns) and max(ns) == pytest.approx(1.5 * n, rel=0.02) and ns == sorted(set(ns))


def test_block_split_sums_to_one_layer_of_the_forward_pass():
    """One block's groups are exactly the per-layer part of `predict` (no embedding, no head)."""
    whole = costmodel.predict(MINILM, 256, costmodel.PI5, "fused").by_group
    block = crossover.block_split(MINILM, 256, costmodel.PI5, "fused")
    assert block["attention"] == pytest.approx(whole["attention"] / MINILM.n_layers, rel=1e-9)
    assert block["mlp"] == pytest.approx(whole["mlp"] / MINILM.n_layers, rel=1e-9)


def test_crossing_of_known_ratios_is_exact():
    ns = [250, 500, 1000, 2000, 4000]
    assert crossover.crossing(ns, [n / 1000 for n in ns]) == pytest.approx(1000)
    assert crossover.crossing(ns, [(n / 1500) ** 2 for n in ns]) == pytest.approx(1500)
    assert crossover.crossing(ns, [0.1] * 5) is None and crossover.crossing(ns[:2], [0.3, 0.6]) is None  # never straddled


def test_a_block_reads_no_positions_and_rope_angles_are_made_for_n():
    """MiniLM reads at most 512 positions, but one block of it runs on 1,000 tokens; a RoPE model's
    block gets its angles for n from iter_blocks, beyond its 64 positions."""
    for spec in (TINY, ROPE):
        model = measure.load(spec)
        block, att = crossover.measure_block(model, 200, parse_variant("fused"), repeats=2, warmup=1, clock="cpu")
        assert block.runs == att.runs == 2 and block.median > 0 and att.median > 0
    model = measure.load(ROPE)
    x = torch.randn(1, 100, 32)
    out = model.net.run_blocks(x, 0, 1).x
    assert out.shape == (1, 100, 32) and torch.isfinite(out).all()


def test_sweep_times_one_block_across_the_crossover_and_the_csv_says_so():
    plan = sweep.SweepPlan(models=[TINY], seq_lens=[8, 16], threads=[torch.get_num_threads()], backends=["cpu"],
                           repeats=2, warmup=1, memory=False, clock="cpu", crossover=True)
    models = {TINY: measure.load(TINY)}
    assert sweep.estimate(plan, {TINY: models[TINY].cfg}).seconds > sweep.estimate(
        sweep.SweepPlan(**{**plan.__dict__, "crossover": False}), {TINY: models[TINY].cfg}).seconds
    df = sweep.run_sweep(plan, models)
    blocks = df[df["test"] == "block"]
    measured, modelled = blocks[blocks["measured"]], blocks[~blocks["measured"]]
    assert len(measured) == len(modelled) == len(crossover.FACTORS) and set(modelled["backend"]) == {"cpu-model"}
    assert sorted(measured["seq_len"]) == sorted(modelled["seq_len"])
    assert (measured["attention_ms"] > 0).all() and (measured["median_ms"] > 0).all()  # timed apart: no order
    assert len(df[df["test"].isna()]) == 2  # the forward passes are there as before
    back = read_results(results.to_csv(df).encode())
    assert (back["test"] == "block").sum() == 2 * len(crossover.FACTORS)
    table = crossover.crossover_table(back)
    assert len(table) == 1 and table["modelled_n"].iloc[0] > 0
    assert math.isnan(table["error_pct"].iloc[0]) or table["measured_n"].iloc[0] > 0


def test_crossover_figure_marks_both_and_says_it_is_one_block():
    ns = [200, 400, 800, 1600]
    rows = pd.DataFrame([dict(seq_len=n, measured=m, median_ms=n / 10 + n * n / (10 * c), attention_ms=n * n / (10 * c))
                         for n in ns for m, c in ((True, 800), (False, 700))])  # attention / rest = n / c
    table = crossover.crossover_table(rows.assign(test="block", model="minilm", variant="fused", threads=1))
    m, p = table["measured_n"].iloc[0], table["modelled_n"].iloc[0]
    assert m == pytest.approx(800) and p == pytest.approx(700) and table["error_pct"].iloc[0] == pytest.approx(-12.5)
    fig = crossover_figure(rows, m, p, "minilm", positions=512)
    title = fig.layout.title.text
    assert "ONE block" in title and "512 positions" in title and "same shape" in title
    marks = [t.name for t in fig.data if t.name.startswith("crossover")]
    assert marks == ["crossover measured: n≈800", "crossover modelled: n≈700"] and len(fig.data) == 6
    assert list(fig.layout.xaxis.tickvals) == ns


def test_cli_crossover_only_with_its_flag_and_said(tmp_path, capsys):
    """A plain sweep writes only the rows asked for (it added the crossover calibration's cpu-model and
    test=block rows at lengths nobody chose); --crossover adds them and says so."""
    on, off = tmp_path / "on.csv", tmp_path / "off.csv"
    common = ["--model", TINY, "--seq-lens", "8,16", "--threads", str(torch.get_num_threads()), "--repeats", "1",
              "--warmup", "0", "--no-memory", "--clock", "cpu"]
    assert cli.main(common + ["--out", str(off)]) == 0
    plain = read_results(off)
    assert len(plain) == 2 and sorted(plain["seq_len"]) == [8, 16] and set(plain["backend"]) == {"cpu"}
    assert "--crossover" not in capsys.readouterr().err
    assert cli.main(common + ["--crossover", "--out", str(on)]) == 0
    assert (read_results(on)["test"] == "block").sum() == 2 * len(crossover.FACTORS)
    assert "--crossover: added" in capsys.readouterr().err and "test=block" in cli.parser().format_help()


# ---------------------------------------------------------------- int8 / bf16 measured rows
def test_int8_and_bf16_are_measured_rows_of_the_sweep_the_shared_model_untouched():
    model = measure.load(TINY)
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    kinds = {type(m) for m in model.net.modules()}
    plan = sweep.SweepPlan(models=[TINY], seq_lens=[8, 16], threads=[torch.get_num_threads()], backends=["cpu", "pi4"],
                           repeats=2, warmup=1, memory=False, dtypes=["fp32", "int8", "bf16"])
    df = sweep.run_sweep(plan, {TINY: model})
    cpu = df[df["measured"]]
    assert sorted(cpu["dtype"]) == sorted(["fp32", "int8", "bf16"] * 2) and (cpu["median_ms"] > 0).all()
    assert set(df[df["backend"] == "pi4"]["dtype"]) == {"fp32", "int8"}  # the Pi's cores have no bf16
    assert {type(m) for m in model.net.modules()} == kinds
    assert all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())
    back = read_results(results.to_csv(df).encode())
    assert set(back[back["measured"]]["dtype"]) == {"fp32", "int8", "bf16"}
    assert sweep.SweepPlan(models=[TINY], seq_lens=[8], dtypes=["fp16"]).measured_dtypes() == ["fp32"]


def test_int8_rows_differ_from_fp32_in_what_ran():
    """The int8 copy is torch's dynamic quantization: its linear layers hold packed int8 weights."""
    from attnviz.latency.quantize import quantized_copy
    model = measure.load(TINY)
    twin = quantized_copy(model, "int8")
    names = {type(m).__name__ for m in twin.net.modules()}
    assert "QuantLinear" in names and "QuantLinear" not in {type(m).__name__ for m in model.net.modules()}
    ids = torch.randint(0, 50, (1, 8))
    with torch.inference_mode():
        a, b = model.net(input_ids=ids).hidden, twin.net(input_ids=ids).hidden
    assert not torch.equal(a, b) and np.corrcoef(a.flatten(), b.flatten())[0, 1] > 0.9


class StopsAfter:
    """A deadline that expires after n checks (as in test_bench): behaviour, not the clock."""

    def __init__(self, n):
        self.left, self.seconds, self.what = n, 600, "the sweep"

    def check(self):
        self.left -= 1
        if self.left < 0:
            raise jobs.JobTimeout("the sweep stopped at its time limit of 600 s")


def test_a_deadline_in_the_block_rounds_keeps_the_lengths_measured_and_names_the_rest():
    plan = sweep.SweepPlan(models=[TINY], seq_lens=[8], threads=[torch.get_num_threads()], backends=["cpu"],
                           repeats=2, warmup=0, memory=False, clock="cpu", crossover=True)
    # the forward point: 1 + 2 checks; each block run: 1 + 1 (block) + 1 (attention alone)
    df = sweep.run_sweep(plan, {TINY: measure.load(TINY)}, deadline=StopsAfter(3 + 2 * 3))
    blocks = df[(df["test"] == "block") & df["measured"]]
    assert len(blocks) == 2 and (df[(df["test"] == "block") & ~df["measured"]]).shape[0] == len(crossover.FACTORS)
    assert "stopped at its time limit" in df.attrs["stopped"] and df.attrs["stopped"].count("one block n=") == 3
