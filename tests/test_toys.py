"""Toy transformers: exact task data, training to >= 99% on copy, the time budget, gradient
checkpointing (same gradients, less memory), shipped checkpoints at their stated accuracy."""
import pytest
import torch

import attnviz
from attnviz.toys import tasks
from attnviz.toys.training import (TensorMeter, TrainSettings, _loss, check_settings, checkpointed,
                                  estimate_seconds, train, training_memory)
from attnviz.core.transformer import Transformer

ALL = [tasks.Task(name, length=5, n_keys=7) for name in tasks.TASKS]


@pytest.mark.parametrize("task", ALL, ids=lambda t: t.name)
def test_task_answers_and_sources_are_exact(task):
    inputs, answers, sources = task.sample(64, torch.Generator().manual_seed(0))
    assert inputs.shape == (64, task.seq_len) and answers.shape == sources.shape == (64, task.length)
    full = torch.cat([inputs, answers[:, -1:]], 1)
    # teacher forcing: the token after each answer position is the answer ...
    assert torch.equal(full[:, [p + 1 for p in task.answer_positions]], answers)
    # ... and it is the token found at its source position, earlier in the input
    assert torch.equal(inputs.gather(1, sources), answers)
    assert torch.all(sources < torch.tensor(task.answer_positions))
    x = inputs[:, 1:task.length + 1] if task.name != "recall" else None
    if task.name == "sort":
        assert torch.equal(answers, x.sort(-1).values)
    if task.name == "reverse":
        assert torch.equal(answers, x.flip(-1))


def test_prompts_and_solutions():
    recall = tasks.Task("recall", length=3, n_keys=5)
    ids, queries = recall.prompt("a3 b1 c4 | c a")
    assert recall.solve(ids, queries) == [recall.vocab.index("4"), recall.vocab.index("3")]
    sort = tasks.Task("sort", length=4)
    ids, _ = sort.prompt("3141")
    assert [sort.vocab[i] for i in sort.solve(ids, [])] == list("1134")
    for bad, match in [("314", "expects 4 digits"), ("31x1", "vocabulary")]:
        with pytest.raises(ValueError, match=match):
            sort.prompt(bad)
    for bad, match in [("a3 b1 c4 c", r"\|"), ("a3 a1 c4 | a", "distinct"), ("a3 b1 c4 | d", "ask")]:
        with pytest.raises(ValueError, match=match):
            recall.prompt(bad)
    with pytest.raises(ValueError, match="unknown task"):
        tasks.Task("translate")


def test_copy_task_reaches_99_percent():
    threads = torch.get_num_threads()
    # stop_at_budget=False: the test asserts learning, not the wall time of a shared machine
    result = train(TrainSettings(task=tasks.Task("copy", length=6), steps=250, seed=0), stop_at_budget=False)
    assert not result.stopped_early and result.steps_done == 250
    assert torch.get_num_threads() == threads  # training's single thread is given back
    assert result.score.exact >= 0.99
    assert result.losses[-1] < result.losses[0] / 100
    answer, truth = tasks.complete(result.model, "503142")
    assert answer == truth == list("503142")


def test_settings_over_budget_are_refused_with_advice():
    fits = TrainSettings(steps=300)
    check_settings(fits)
    too_long = TrainSettings(steps=20000)
    assert estimate_seconds(too_long) > 60
    with pytest.raises(ValueError, match=r"over the 60 s budget.*at most \d+ steps"):
        check_settings(too_long)
    with pytest.raises(ValueError, match="budget"):
        train(TrainSettings(n_layers=8, d_model=256, steps=3000))
    with pytest.raises(ValueError, match="multiple of the number of heads"):
        check_settings(TrainSettings(d_model=64, n_heads=3))
    assert estimate_seconds(TrainSettings(checkpoint=True)) > estimate_seconds(TrainSettings())


def test_checkpointing_gives_the_same_gradients_with_less_memory():
    s = TrainSettings(task=tasks.Task("copy", length=8), n_layers=3)
    torch.manual_seed(0)
    net = Transformer(s.config()).train()
    inputs, answers, _ = s.task.sample(16, torch.Generator().manual_seed(0))
    grads = []
    for use in (False, True):
        net.zero_grad()
        _loss(net, s.task, inputs, answers, None, use).backward()
        grads.append([p.grad.clone() for p in net.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))
    with checkpointed(net):
        assert "forward" in vars(net.blocks[0])
    assert "forward" not in vars(net.blocks[0])  # restored
    plain, ckpt = training_memory(s, False), training_memory(s, True)
    assert ckpt.step_peak < 0.8 * plain.step_peak
    assert plain.resident == ckpt.resident > 0


def test_tensor_meter_counts_live_storages():
    meter = TensorMeter()
    with meter:
        a = torch.ones(1000, 250)   # 1 MB
        b = a * 2                   # 1 MB more
        del b
        c = a + 1
    assert meter.peak == 2_000_000
    assert meter.current == 2_000_000  # a and c still alive
    del a, c


# ---------------------------------------------------------------- shipped checkpoints
def test_shipped_toys_are_listed_small_and_complete():
    assert {"toy-copy", "toy-reverse", "toy-sort", "toy-recall"} <= set(tasks.TOYS)
    keys = {m.key for m in attnviz.list_models()}
    assert set(tasks.TOYS) <= keys
    total = sum(p.stat().st_size for p in tasks.TOY_DIR.iterdir() if p.is_file())
    assert total < 2_000_000
    assert sum(1 for k in tasks.TOYS if tasks.TOYS[k].get("compare")) == 2


@pytest.mark.parametrize("key", sorted(tasks.TOYS))
def test_shipped_toy_reaches_stated_accuracy(key):
    m = attnviz.load_model(key)
    stated = tasks.TOYS[key]["accuracy"]
    score = tasks.evaluate(m)
    assert score.n == tasks.EVAL_SIZE
    assert score.exact == pytest.approx(stated["exact"], abs=2e-3)
    assert score.exact >= 0.95
    answer, truth = tasks.complete(m, m.task.example_prompt())
    assert answer == truth


def test_recall_toy_has_induction_and_previous_token_heads():
    m = attnviz.load_model("toy-recall")
    scores = tasks.head_scores(m)
    assert scores["source"][-1].max() > 0.5      # an induction head in the last layer
    assert scores["previous"][0].max() > 0.3     # a previous-token head in the first layer
    tokens, att = tasks.example(m)
    assert att.shape == (2, m.cfg.n_heads, len(tokens), len(tokens))


def test_head_toggling_and_pruning_curve():
    m = attnviz.load_model("toy-copy")
    L, H = m.cfg.n_layers, m.cfg.n_heads
    full = tasks.evaluate(m, n=500)
    assert tasks.evaluate(m, torch.ones(L, H), n=500) == full
    off = tasks.evaluate(m, torch.zeros(L, H), n=500)
    assert off.exact < 0.05
    curve = tasks.pruning_curve(m, n=300)
    assert len(curve) == L * H + 1
    assert curve[0]["exact"] == tasks.evaluate(m, n=300).exact
    assert curve[-1]["exact"] == tasks.evaluate(m, torch.zeros(L, H), n=300).exact
    assert len({r["head"] for r in curve[1:]}) == L * H
    with pytest.raises(ValueError, match="head_mask"):
        tasks.evaluate(m, torch.ones(L + 1, H))


def test_training_never_changes_the_process_thread_count(monkeypatch):
    """torch.set_num_threads is process-wide: a training that set it to 1 (even restoring it after)
    held every other session of the server to one thread meanwhile. Now the training's own thread
    runs on one OpenMP thread and a thread started meanwhile (another session) gets the default."""
    import threading

    from attnviz.toys import training
    default = torch.get_num_threads()
    calls, seen = [], []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))

    def progress(step, total, loss):
        other = []
        t = threading.Thread(target=lambda: other.append(torch.get_num_threads()))
        t.start(), t.join()
        seen.append((torch.get_num_threads(), other[0]))

    s = TrainSettings(task=tasks.Task("copy", length=3), n_layers=1, d_model=32, steps=3, batch_size=8)
    result = train(s, progress, stop_at_budget=False)
    training_memory(s)
    assert result.steps_done == 3 and calls == []
    assert torch.get_num_threads() == default
    assert all(other == default for _, other in seen)              # other sessions: untouched
    if training._openmp() is not None:                         # Linux builds: OpenMP runtime found
        assert all(mine == 1 for mine, _ in seen)


def test_training_keeps_its_time_limit(monkeypatch):
    """A clock that moves 10 s per reading: the run stops at its budget (no wall-time assertion)."""
    import types

    from attnviz.toys import training
    ticks = iter(range(0, 10_000, 10))
    monkeypatch.setattr(training, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    s = TrainSettings(task=tasks.Task("copy", length=3), n_layers=1, d_model=32, steps=50, batch_size=8,
                      budget_s=25.0)
    result = train(s)
    assert result.stopped_early and 0 < result.steps_done < 50
