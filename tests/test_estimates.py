"""Estimates hold on this machine: a toy training's time, timed from a few of its own steps here,
is within 2x of the training measured right after it (both timed in the test, side by side: the
ratio is the claim, not a wall time). Before, a formula for an idle machine said "17 s" for a
training that hit its 60 s limit after 379 of 600 steps."""
from __future__ import annotations

from attnviz.toys import tasks, training


def test_a_toy_trainings_timed_estimate_is_within_2x_of_its_measured_time():
    s = training.TrainSettings(task=tasks.Task("copy", 8, n_keys=16), n_layers=2, n_heads=2, d_model=32,
                               steps=120, budget_s=60)
    every = 60
    guess = training.timed_estimate(s, every)
    result = training.train(s, eval_every=every, stop_at_budget=False)
    assert result.steps_done == s.steps and len(result.history) == 2
    assert 0.5 <= guess / result.seconds <= 2.0, (guess, result.seconds)


def test_the_first_load_says_which_models_are_held_their_memory_and_what_goes_next(monkeypatch):
    """Before: walking the pages reloaded a model with no word that only 4 stay in memory."""
    from attnviz.base.limits import LIMITS
    from attnviz.ui import loaded_models

    class Fake:
        def __init__(self, n):
            self.n = n

        def num_params(self):
            return self.n

    monkeypatch.setattr(LIMITS, "model_cache_entries", 2)
    monkeypatch.setattr(loaded_models, "IN_MEMORY", {})
    assert loaded_models.note("minilm", Fake(2**20)) == ("In memory on this server: minilm (4 MB); 4 MB in all. "
                                                         "At most 2 models stay loaded.")
    text = loaded_models.note("smollm2", Fake(2**21))
    assert text.startswith("In memory on this server: smollm2 (8 MB), minilm (4 MB); 12 MB in all.")
    assert text.endswith("loading another drops minilm, which then loads again when a page needs it.")
    loaded_models.note("minilm", Fake(2**20))                              # used again: smollm2 goes next
    assert "drops smollm2" in loaded_models.note("minilm", Fake(2**20))
    loaded_models.note("dinov2", Fake(2**20))
    assert list(loaded_models.IN_MEMORY) == ["minilm", "dinov2"]
