"""Generation with the key/value cache equals rerunning the whole text at every step; sampling,
masks, mean ablation and the bounds."""
import pytest
import torch

from attnviz.analysis import head_ablation, generation
from attnviz.base import jobs
from attnviz.weights.catalogue import random_model
from tests.test_readouts import GPT2
from tests.tiny import BERT, LLAMA

PROMPT = [3, 17, 5, 42, 8, 8, 21]


@pytest.fixture(params=["llama", "gpt2"])
def lm(request):
    return random_model(LLAMA if request.param == "llama" else GPT2, seed=7)


def check_against_uncached(model, gen, head_mask=None, logits_of=None):
    """Each step's distribution and attention row, recomputed from the whole text so far."""
    ids = list(gen.prompt_ids)
    for step in gen.steps:
        tr = model.trace(ids, head_mask=head_mask)
        logits = tr.logits[-1] if logits_of is None else logits_of(ids)[-1]
        probs = logits.softmax(-1)
        torch.testing.assert_close(torch.tensor(step.top_probs), probs.topk(len(step.top_ids)).values,
                                   atol=1e-5, rtol=1e-4)
        assert step.top_ids[0] == int(probs.argmax())
        assert step.prob == pytest.approx(float(probs[step.token]), abs=1e-5)
        if logits_of is None:
            torch.testing.assert_close(step.attention, tr.attentions[:, :, -1], atol=1e-5, rtol=1e-4)
        ids.append(step.token)


def test_cached_equals_uncached(lm):
    gen = generation.generate(lm, PROMPT, 8)
    assert len(gen.steps) == 8 and gen.stopped == "length"
    assert all(s.token == s.top_ids[0] for s in gen.steps)  # greedy by default
    assert gen.steps[3].attention.shape == (3, 4, len(PROMPT) + 3)
    check_against_uncached(lm, gen)


def test_sampling_is_seeded_and_cut(lm):
    a = generation.generate(lm, PROMPT, 10, temperature=1.5, seed=3)
    b = generation.generate(lm, PROMPT, 10, temperature=1.5, seed=3)
    assert a.ids == b.ids
    check_against_uncached(lm, a)
    greedy = generation.generate(lm, PROMPT, 10)
    assert generation.generate(lm, PROMPT, 10, temperature=2.0, top_k=1, seed=1).ids == greedy.ids
    assert generation.generate(lm, PROMPT, 10, temperature=2.0, top_p=1e-6, seed=1).ids == greedy.ids
    others = {tuple(generation.generate(lm, PROMPT, 10, temperature=3.0, seed=s).ids) for s in range(4)}
    assert len(others) > 1


def test_pick_top_p_keeps_the_smallest_set():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0]).log_softmax(-1)
    draws = {generation.pick(logits, 1.0, 0, 0.7, torch.Generator().manual_seed(s)) for s in range(60)}
    assert draws == {0, 1}  # p = .64, .24, ...: the first alone is under .7, two reach it


def test_masks_apply_to_generation(lm):
    mask = torch.ones(3, 4)
    mask[0] = 0
    mask[2, 1] = 0
    full = generation.generate(lm, PROMPT, 8)
    masked = generation.generate(lm, PROMPT, 8, head_mask=mask)
    check_against_uncached(lm, masked, head_mask=mask)
    assert masked.settings["heads_off"] == 5
    j = generation.first_difference(full, masked)
    assert j is None or full.ids[:j] == masked.ids[:j]


def test_mean_ablation_in_generation():
    lm = random_model(LLAMA, seed=9)
    means = head_ablation.head_means(lm, torch.tensor([1, 2, 3, 4, 5, 6, 7, 8]))
    mask = torch.ones(3, 4)
    mask[1, :2] = 0
    gen = generation.generate(lm, PROMPT, 6, head_mask=mask, ablation="mean", means=means)
    check_against_uncached(lm, gen, logits_of=lambda ids: head_ablation.logits(lm, ids, mask, "mean", means))


def test_bounds(set_limits):
    lm = random_model(GPT2)
    with pytest.raises(ValueError, match="between 1 and"):
        generation.generate(lm, PROMPT, 1000)
    with pytest.raises(ValueError, match="temperature"):
        generation.generate(lm, PROMPT, 3, temperature=-1)
    with pytest.raises(ValueError, match="top-p"):
        generation.generate(lm, PROMPT, 3, top_p=0)
    with pytest.raises(ValueError, match="not a language model"):
        generation.generate(random_model(BERT), PROMPT, 3)
    long = [1 + i % 40 for i in range(60)]  # GPT2 here has 64 positions: 4 more are fed, 5 predicted
    gen = generation.generate(lm, long, 10)
    assert gen.stopped == "positions" and len(gen.steps) == 5
    set_limits(max_generate_seconds=0.0)
    gen = generation.generate(lm, PROMPT, 10)
    assert gen.stopped == "time" and len(gen.steps) == 1
    set_limits(max_heavy_jobs=1)
    with jobs.heavy_job("another job"), pytest.raises(jobs.ServerBusy):
        generation.generate(lm, PROMPT, 3)
    cancel = jobs.Cancel()
    cancel.set()
    with pytest.raises(jobs.JobCancelled):
        generation.generate(lm, PROMPT, 3, cancel=cancel)


def test_the_prompt_is_bounded_and_its_pass_records_no_n_by_n_pattern(set_limits):
    """Readouts › Generation: the prompt pass never holds a layer's [H, n, n] (a long prompt once took
    the process past 22 GB); a prompt over the readouts' limit is refused before any block runs."""
    lm = random_model(LLAMA, seed=7)
    shapes = []

    def record(module, args, out):
        shapes.append(None if out[1] is None else tuple(out[1].shape))
    hooks = [b.attn.register_forward_hook(record) for b in lm.net.blocks]
    try:
        gen = generation.generate(lm, PROMPT, 3)
        assert any(s is None for s in shapes)                     # the prompt's first tokens: no weights
        assert [s for s in shapes if s is not None] and all(s[2] == 1 for s in shapes if s is not None)
        check_against_uncached(lm, gen)                           # the same numbers as the whole text
        shapes.clear()
        set_limits(readout_max_tokens=len(PROMPT) - 1)
        with pytest.raises(ValueError, match=f"prompt has {len(PROMPT)} tokens; generation takes at most "
                                             f"{len(PROMPT) - 1}. Shorten it"):
            generation.generate(lm, PROMPT, 3)
        assert not shapes                                         # refused before any block ran
        set_limits(readout_max_tokens=256, max_capture_mb=0)      # the one capture estimate refuses, too
        with pytest.raises(ValueError, match="Shorten the prompt"):
            generation.generate(lm, PROMPT, 3)
        assert not shapes
    finally:
        for h in hooks:
            h.remove()


def test_frames_and_labels(lm):
    gen = generation.generate(lm, PROMPT, 4)
    frame = generation.steps_frame(gen)
    assert list(frame["step"]) == [0, 1, 2, 3] and list(frame["id"]) == gen.ids
    assert len(generation.step_tokens(gen)) == gen.steps[-1].attention.shape[-1]
