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
