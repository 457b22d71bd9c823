"""Estimates hold on this machine: a toy training's time, timed from a few of its own steps here,
is within 2x of the training measured right after it (both timed in the test, side by side: the
ratio is the claim, not a wall time). Before, a formula for an idle machine said "17 s" for a
training that hit its 60 s limit after 379 of 600 steps."""
from __future__ import annotations

import logging
from pathlib import Path

from attnviz.toys import tasks, training


def test_a_toy_trainings_timed_estimate_is_within_2x_of_its_measured_time():
    s = training.TrainSettings(task=tasks.Task("copy", 8, n_keys=16), n_layers=2, n_heads=2, d_model=32,
                               steps=120, budget_s=60)
    every = 60
    guess = training.timed_estimate(s, every)
    result = training.train(s, eval_every=every, stop_at_budget=False)
    assert result.steps_done == s.steps and len(result.history) == 2
    assert 0.5 <= guess / result.seconds <= 2.0, (guess, result.seconds)


class FakeModel:
    """A stand-in with a net of `mb` MiB of float32 parameters (what loaded_models measures)."""
    def __init__(self, mb: int):
        import torch
        self.net = torch.nn.Linear(mb * 2**18, 1, bias=False)

    def num_params(self):
        return self.net.weight.numel()


def fake_catalogue(monkeypatch, sizes_mb: dict) -> list:
    """common.shared_model loads FakeModels of the given sizes; returns the keys loaded, in order."""
    from attnviz.ui import common
    from attnviz.weights import catalogue
    loads = []

    def load(key):
        loads.append(key)
        return FakeModel(sizes_mb[key])
    monkeypatch.setattr(catalogue, "load_model", load)
    monkeypatch.setattr(common, "settle_heap", lambda: None)
    common.forget_loaded()
    return loads


def test_a_fifth_model_no_longer_drops_the_first_when_the_budget_has_room(monkeypatch):
    """Before: st.cache_resource(max_entries=4) dropped the first of five models, so a walk
    through the pages reloaded smollm2 and dinov2 although memory had room for them."""
    from attnviz.ui import common
    walk = ["smollm2", "dinov2", "minilm", "e5-small", "en-pt", "pt-en", "whisper-tiny-en"]
    loads = fake_catalogue(monkeypatch, dict.fromkeys(walk, 8))
    first = [common.shared_model(k) for k in walk]
    again = [common.shared_model(k) for k in walk]
    assert loads == walk                                  # each loaded once, none dropped
    assert all(a is b for a, b in zip(first, again))      # one shared copy for every session
    common.forget_loaded()


def test_a_small_budget_drops_the_least_recently_used_by_bytes_and_says_so(monkeypatch, set_limits):
    from attnviz.ui import common, loaded_models
    loads = fake_catalogue(monkeypatch, {"minilm": 4, "dinov2": 4, "smollm2": 8, "en-pt": 20})
    set_limits(model_cache_mb=12)
    common.shared_model("minilm")
    common.shared_model("dinov2")
    assert loaded_models.note("dinov2") == ("In memory on this server: dinov2 (4 MB), minilm (4 MB); "
                                            "8 MB of a 12 MB model budget (ATTNVIZ_MODEL_CACHE_MB).")
    common.shared_model("minilm")                         # used again: dinov2 is now the oldest
    common.shared_model("smollm2")                        # 4 + 4 + 8 > 12: one 4 MB model goes
    held = [k for k, _ in loaded_models._models().sizes()]
    assert held == ["minilm", "smollm2"]
    assert loaded_models.note("smollm2").endswith("drops minilm first, which then loads again when a page needs it.")
    common.shared_model("dinov2")                         # dropped, so loaded again
    assert loads == ["minilm", "dinov2", "smollm2", "dinov2"]
    big = common.shared_model("en-pt")                    # larger than the budget: served, not kept
    assert big is not None and not loaded_models.holds("en-pt")
    assert "en-pt is larger than the whole budget: it is not kept" in loaded_models.note("en-pt")
    common.forget_loaded()


def test_sessions_asking_for_one_model_at_once_share_one_load(monkeypatch):
    import threading
    from attnviz.ui import common
    loads = fake_catalogue(monkeypatch, {"minilm": 1})
    gate = threading.Barrier(6)
    got = []

    def session():
        gate.wait()
        got.append(common.shared_model("minilm"))
    threads = [threading.Thread(target=session) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loads == ["minilm"] and len({id(m) for m in got}) == 1
    common.forget_loaded()


def test_model_bytes_count_the_prepacked_copies():
    from attnviz.ui import loaded_models
    from attnviz.weights import catalogue
    model = catalogue.load_model("toy-copy")
    params = sum(p.numel() * p.element_size() for p in model.net.parameters())
    packed = [m._packed for m in model.net.modules() if getattr(m, "_packed", None) is not None]
    assert loaded_models.model_bytes(model) == params + sum(
        p.numel() * p.element_size() for p in packed) + sum(b.numel() * b.element_size() for b in model.net.buffers())




def test_a_first_load_shows_its_stages_reading_converting_caching_of_this_thread_only(tmp_path, monkeypatch):
    """Before: SmolLM2's first load (20-59 s converting) showed a spinner and nothing of where it was."""
    import threading
    import torch
    from attnviz.ui import loaded_models
    from attnviz.weights import conversion_cache
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "model.bin"
    source.write_bytes(b"weights")

    def make(_tmp):
        return {"d": 2}, {"w": torch.ones(2)}
    seen, others = [], []
    with loaded_models.stages(lambda stage, message: seen.append(stage)):
        other = threading.Thread(target=lambda: conversion_cache.converted("other", source, make))
        other.start()
        other.join()                                         # another session's load: not this bar's
        conversion_cache.converted("toy", source, make)
        assert seen == ["converting", "caching"]
        meta, state, _ = conversion_cache.converted("toy", source, make)
    assert seen == ["converting", "caching", "reading", "loaded"] and meta == {"d": 2} and torch.equal(state["w"], torch.ones(2))
    conversion_cache.converted("toy", source, make)          # outside the block: nothing more shown
    assert seen == ["converting", "caching", "reading", "loaded"] and not others
    assert not any(isinstance(h, logging.Handler) and type(h).__name__ == "_Stages"
                   for h in conversion_cache.log.handlers)


def test_the_first_open_of_a_page_shows_a_progress_bar_and_the_budget():
    from streamlit.testing.v1 import AppTest
    from attnviz.ui import common
    common.forget_loaded()
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "pages" / "1_Attention.py"),
                           default_timeout=300).run()
    assert not at.exception
    assert at.get("progress") and at.get("progress")[-1].proto.value == 100     # 1.0 as a percentage
    assert any(c.value.startswith(common.plain("In memory on this server: minilm (127 MB); 127 MB of a 4,096 MB "
                                               "model budget (ATTNVIZ_MODEL_CACHE_MB).")) for c in at.caption)
    common.forget_loaded()
