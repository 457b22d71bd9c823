"""Batched corpus work: several texts (padded) and several head masks (a mask per batch row) per
forward give the per-text figures, padding changes nothing, and a budget is never passed by more
than one batch (counted on an injected clock, never timed).

Tolerance: float32 products of a padded batch split their sums differently from one text's, so
figures may differ in the last bits: per-text and batched figures agree to TOL (absolute), and the
integer ones (top-k token ids) exactly."""
import numpy as np
import pandas as pd
import pytest
import torch

from attnviz.analysis import corpus_batch, corpus_engine, corpus_metrics, corpus_plan, corpus_runs, importance
from attnviz.analysis.corpus import Corpus
from attnviz.analysis.pruning import encode_mask
from attnviz.weights.catalogue import random_model
from tests.test_corpus_metrics import WordTokenizer
from tests.tiny import BERT, LLAMA

TOL = 1e-5
TEXTS = ["t5 t9 t2 t7 t3", "t1 t1 t4 t8", "t6 t2 t2 t2 t9 t11 t4 t4 t8 t3 t3", "t30 t31 t32", "t3 t4\tt5 t6 t7"]
SENTENCES = ["The cat sat on the mat.", "Stock markets fell sharply today.", "A kitten is resting on a rug.",
             "I love you very much.", "The train leaves at noon.", "Rain is expected over the hills tonight."]


@pytest.fixture(scope="module", params=["lm", "encoder"])
def model(request):
    cfg, seed = (LLAMA, 3) if request.param == "lm" else (BERT, 4)
    return random_model(cfg, seed=seed, tokenizer=WordTokenizer())


def texts_of(model):
    return TEXTS if not model.next_token else [t.replace("\t", " ") for t in TEXTS]


def masks_of(model):
    L, H = model.cfg.n_layers, model.cfg.n_heads
    gen = torch.Generator().manual_seed(0)
    masks = [None, torch.ones(L, H)] + [(torch.rand(L, H, generator=gen) > 0.4).float() for _ in range(4)]
    late = torch.ones(L, H)
    late[L - 1, 0] = 0           # changes only the last layer: the rows start there, from the kept states
    return masks + [late]


def assert_close(want: dict, got: dict):
    assert want.keys() == got.keys()
    for k, v in want.items():
        if isinstance(v, np.ndarray) and v.dtype.kind in "iub":
            np.testing.assert_array_equal(v, got[k], err_msg=k)
        elif isinstance(v, (np.ndarray, float)):
            np.testing.assert_allclose(v, got[k], rtol=0, atol=TOL, err_msg=k)
        else:
            assert v == got[k], k


def test_a_mask_per_batch_row_equals_each_mask_alone(model):
    ids = torch.tensor([[0, 5, 9, 2, 7]]).expand(3, -1)
    masks = torch.stack([m if m is not None else torch.ones(model.cfg.n_layers, model.cfg.n_heads)
                         for m in masks_of(model)[2:5]])
    with torch.inference_mode():
        rows = model.net(input_ids=ids, head_mask=masks).hidden
        for r in range(3):
            alone = model.net(input_ids=ids[:1], head_mask=masks[r]).hidden[0]
            torch.testing.assert_close(rows[r], alone, rtol=0, atol=TOL)


def test_batched_figures_equal_the_per_text_figures(model):
    texts, masks = texts_of(model), masks_of(model)
    got = corpus_batch.masked_outputs(model, texts, masks)
    for t, text in enumerate(texts):
        for j, mask in enumerate(masks):
            assert_close(corpus_metrics.output(model, text, mask), got[t][j])


def test_padding_changes_nothing(model):
    """A short text alone and beside a long one (padded to its length: right padding, masked as the
    model's own attention mask does for an encoder; a causal model's real tokens never see it)."""
    short, long = "t3 t8 t1", " ".join(f"t{i % 40 + 1}" for i in range(60))
    masks = masks_of(model)
    alone = corpus_batch.masked_outputs(model, [short], masks)[0]
    beside = corpus_batch.masked_outputs(model, [long, short], masks)[1]
    for a, b in zip(alone, beside):
        assert_close(a, b)
    windows = [torch.tensor(model.tokenizer(t)["input_ids"]) for t in (short, long)]
    one = corpus_batch.gradient_raws(model, windows[:1], [7], importance.GRAD_PROBES)[0]
    two = corpus_batch.gradient_raws(model, windows, [7, 8], importance.GRAD_PROBES)[0]
    np.testing.assert_allclose(one, two, rtol=0, atol=TOL)


def test_batched_gradients_equal_each_texts_own(model):
    texts = [t.replace("\t", " ") for t in TEXTS]
    windows = [torch.tensor(model.tokenizer(t)["input_ids"]) for t in texts]
    raws = corpus_batch.gradient_raws(model, windows, [11 + i for i in range(len(texts))], importance.GRAD_PROBES)
    for i, w in enumerate(windows):
        want = importance.gradient_importance(model, importance.EvalSet(w[None], 0, 0), seed=11 + i).raw.numpy()
        np.testing.assert_allclose(want, raws[i], rtol=0, atol=TOL)


def corpus(n=len(SENTENCES)):
    return Corpus(key="test-texts", kind="text", items=SENTENCES[:n], labels=None, notes=[], source="tests",
                  licence="test text")


def test_a_run_in_batches_gives_the_per_text_figures():
    """MiniLM's pruning curve run in batches of four against each text's own per-item task."""
    curve = dict(fractions=(0.0, 0.3), random_orders=1)
    got = corpus_runs.run("minilm", corpus(), "pruning_curve", per_task=4, **curve)
    assert got.complete and got.extra["workers"] == {"in-process": 2 * len(SENTENCES)}
    codes = sorted({s["code"] for s in got.extra["steps"]})
    for index, text in enumerate(SENTENCES):
        want = corpus_runs.masks_task("minilm", dict(codes=codes), index, text)
        rows = got.table[got.table["item"] == index]
        for step in got.extra["steps"]:
            row = rows[(rows["order"] == step["order"]) & (rows["fraction"] == step["fraction"])].iloc[0]
            for metric, value in want["steps"][step["code"]]["metrics"].items():
                assert row[metric] == pytest.approx(value, abs=TOL, nan_ok=True), (index, step, metric)
    one_by_one = corpus_runs.run("minilm", corpus(4), "importance", per_task=1)
    batched = corpus_runs.run("minilm", corpus(4), "importance", per_task=4)
    pd.testing.assert_frame_equal(one_by_one.summary, batched.summary, check_exact=False, rtol=0, atol=TOL)


def one_off():
    keep = torch.ones(6, 12, dtype=torch.bool)
    keep[3, 1] = False
    return encode_mask(keep)


class Clock:
    """Seconds that pass only when a batch runs: `batch_seconds[k]` for the k-th batch (the last
    figure for every later one)."""

    def __init__(self, batch_seconds):
        self.now, self.batch_seconds, self.batches = 0.0, list(batch_seconds), 0

    def __call__(self):
        return self.now

    def ran(self):
        self.now += self.batch_seconds[min(self.batches, len(self.batch_seconds) - 1)]
        self.batches += 1


@pytest.mark.parametrize("batch_seconds, budget, batches", [
    ([10.0], 25.0, 2),            # the third batch would end at 30 s: not started, the run ends at 20 s
    ([10.0], 30.0, 3),            # ends exactly at the budget
    ([10.0, 10.0, 40.0], 35.0, 3),  # the third batch is slower than measured: past the budget by that one batch
])
def test_a_run_never_passes_its_budget_by_more_than_one_batch(monkeypatch, batch_seconds, budget, batches):
    clock, task = Clock(batch_seconds), corpus_runs.batch_task

    def timed(*args):
        out = task(*args)
        clock.ran()
        return out
    monkeypatch.setattr(corpus_runs, "batch_task", timed)
    same = Corpus(key="same", kind="text", items=[SENTENCES[0]] * 6)    # equal batches: the rate predicts them
    result = corpus_runs.run("minilm", same, "mask", mask=one_off(), budget=budget, clock=clock, per_task=1)
    assert clock.batches == batches and result.done == batches and not result.complete
    last = batch_seconds[min(batches - 1, len(batch_seconds) - 1)]
    assert clock.now <= budget + last
    est = result.extra["estimate"]
    assert est["batches"] == batches and est["budget"] == budget and est["seconds"] == clock.now
    assert est["rate"] == pytest.approx(est["units_done"] / clock.now)


def test_the_estimate_counts_the_plan_and_updates_from_measurements(monkeypatch):
    clock, task, seen = Clock([5.0]), corpus_runs.batch_task, []

    def timed(*args):
        out = task(*args)
        clock.ran()
        return out
    monkeypatch.setattr(corpus_runs, "batch_task", timed)
    result = corpus_runs.run("minilm", corpus(4), "mask", mask=one_off(), clock=clock, per_task=2,
                             progress=lambda done, total, partial: seen.append(dict(partial.extra["estimate"])))
    assert result.complete and len(seen) == 4
    tokens = corpus_runs.item_tokens(corpus_engine.worker_model("minilm"), SENTENCES[:4])
    assert seen[-1]["units_total"] == pytest.approx(2 * sum(tokens))     # the full output and one mask a text
    first = seen[0]      # after the first batch of two: the rate it measured prices the other half
    assert first["rate"] == pytest.approx(first["units_done"] / 5.0)
    assert first["seconds_total"] == pytest.approx(5.0 * first["units_total"] / first["units_done"])
    assert seen[-1]["seconds_left"] == pytest.approx(0.0, abs=1e-9) and seen[-1]["seconds"] == 10.0


def test_batches_are_even_and_the_same_wherever_they_run():
    items = list(enumerate("abcdefghij"))
    got = corpus_plan.batches(items, [5, 1, 4, 2, 3, 9, 8, 7, 6, 10], per_task=4)
    assert [len(c) for _, c in got] == [3, 3, 2, 2]                   # 3 batches rounded up to 4 for two workers
    assert sorted(i for _, c in got for i, _ in c) == list(range(10))
    assert got == corpus_plan.batches(items, [5, 1, 4, 2, 3, 9, 8, 7, 6, 10], per_task=4)
    assert [len(c) for _, c in corpus_plan.batches(items[:3], None, per_task=4)] == [3]


def test_a_plan_is_priced_from_the_cost_models_flops_and_the_default_is_the_most_that_fits():
    from attnviz.latency import corpus_cost
    per = corpus_cost.flops_per_token(LLAMA, 10)
    assert per > 2 * 3 * (32 * 32 * 2)                    # at least the attention projections of 3 layers
    plan = corpus_plan.plan("pruning_curve", "lm", [10, 10], 2, masks=4, cells=12, probes=8)
    assert plan.total() == 2 * 10 * corpus_plan.GRADIENT_FORWARDS + 2 * 10 * 5
    got = corpus_cost.price(LLAMA, plan, 10, gflops=1.0)
    assert got["flops"] == pytest.approx(plan.total() * per)
    # a gradient pass's forward-tokens take their phase's pace in time, not in FLOPs
    assert got["seconds"] == pytest.approx((2 * 10 * corpus_plan.GRADIENT_FORWARDS * corpus_plan.PACE["importance"]
                                            + 2 * 10 * 5) * per / 1e9)

    def plan_of(n):
        return corpus_plan.plan("pruning_curve", "lm", [10] * n, n, masks=4, cells=12, probes=8)
    seconds_per_item = corpus_cost.price(LLAMA, plan_of(1), 10, 1.0)["seconds"]
    sizes = [5, 10, 20, 50]
    assert corpus_cost.fitting(LLAMA, sizes, plan_of, lambda n: 10, 21 * seconds_per_item, 1.0, 1.0) == 2
    assert corpus_cost.fitting(LLAMA, sizes, plan_of, lambda n: 10, seconds_per_item, 1.0, 1.0) == 0


def test_each_phase_is_priced_at_its_own_measured_rate():
    now = [0.0]
    budget = corpus_plan.Budget(100.0, clock=lambda: now[0])
    plan = corpus_plan.Plan({"importance": [10.0, 10.0], "scored": [100.0, 100.0]})
    budget.begin("importance")
    now[0] = 10.0
    budget.finished(10.0)           # gradients: 1 forward-token a second
    est = budget.estimate(plan)
    # the scored phase from the only rate known, at its pace: masked forwards go faster than gradients
    assert est["seconds_left"] == pytest.approx(10.0 + 200.0 / corpus_plan.PACE["importance"])
    assert est["forward_rate"] == pytest.approx(corpus_plan.PACE["importance"])
    budget.begin("importance")
    now[0] = 20.0
    budget.finished(10.0)
    budget.begin("scored")
    now[0] = 30.0
    budget.finished(100.0)          # masked forwards: 10 a second
    est = budget.estimate(plan)
    assert est["seconds_left"] == pytest.approx(10.0) and est["seconds_total"] == pytest.approx(40.0)
    assert not budget.exhausted(100.0) and budget.exhausted(800.0)   # 30 s + 80 s would pass 100 s


def test_a_masked_batch_carries_as_many_texts_as_fit_its_rows():
    per = corpus_plan.TEXTS_PER_TASK
    assert corpus_plan.texts_per_task({}) == per                                  # gradients: the texts
    assert corpus_plan.texts_per_task({"codes": ["m"]}) == per                    # one mask: 2 rows a text
    assert corpus_plan.texts_per_task({"codes": [str(i) for i in range(24)]}) == 1   # a curve: 25 rows a text
    assert corpus_plan.texts_per_task({"codes": ["m"] * 200}) == 1                # never fewer than one
    assert corpus_plan.texts_per_task({"codes": ["m"]}, per_task=2) == 2          # a caller's smaller batches stay
