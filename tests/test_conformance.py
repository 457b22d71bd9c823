"""Every analysis on every family's tiny model (decoders, encoders, vision), checked against the
trace: the analyses read what the blocks computed (`Block.explain`, `Block.head_parts`), so a
family's QK-norm, windows, soft caps, sandwich norms, experts, position terms or prefix tokens reach
them without a line of their own."""
import functools

import pytest
import torch

import attnviz
from attnviz.analysis import capture, generation, head_recompute, readouts, vision
from attnviz.core.attention import Variant
from attnviz.weights.families import FAMILIES as REGISTERED
from tests.test_image_text import CAPTIONS, DUAL, blip_tokenizer, tiny_blip, tiny_dual
from tests.test_image_text import tokenizer as dual_tokenizer
from tests.test_parity import DECODERS, ENCODERS, VISION, close, tiny

FAMILIES = ["gpt2", "llama", *DECODERS]
LONG = 13  # tokens: past every tiny window (4, 5), so windows and two RoPE bases matter


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return attnviz.from_hf(tiny(request.param))


def ids(n=LONG):
    torch.manual_seed(1)
    return torch.randint(0, 99, (n,))


def test_step_by_step_head_equals_the_trace(model):
    x = ids()
    assert head_recompute.verify(model, x) < 1e-5
    tr = model.trace(x, states=True, layers=[1])
    steps = head_recompute.head_steps(model, tr, 1, 2)
    assert steps.output_diff < 1e-5
    if model.cfg.qk_norm != "none":
        assert "Q_norm" in steps.steps and "K_norm" in steps.steps


def test_long_capture_equals_the_trace(model, monkeypatch):
    x = ids()
    full = model.trace(x).attentions                                   # [L, H, n, n]
    for floats in (capture.CHUNK_FLOATS, 4 * LONG * 5):                # the block's own weights; row chunks
        monkeypatch.setattr(capture, "CHUNK_FLOATS", floats)
        got = capture.capture_text(model, x, max_window=LONG)
        assert got.attentions.shape == full.shape
        assert (got.attentions - full).abs().max() < 1e-5, floats


def test_each_heads_attribution_is_its_own_output(model):
    """The MLPs' share is measured, not inferred: each block's MLP branch is hooked, its actual
    output taken through the frozen final norm and the unembedding. Heads + MLPs + the rest add up
    to the logit, so a head's share that is wrong shows as an MLP's share that differs."""
    x = ids()
    target = 5
    if not all(block.additive for block in model.net.blocks):  # post-norm (OPT-350m's layout): refused
        with pytest.raises(ValueError, match="pre-norm"):
            readouts.attribution(model, x, target)
        return
    branch = {}
    hooks = []
    for i, block in enumerate(model.net.blocks):
        last = block.norm2_out if block.norm2_out is not None else block.mlp
        hooks.append(last.register_forward_hook(lambda m, a, out, i=i: branch.__setitem__(i, out[0, -1].float())))
    try:
        att = readouts.attribution(model, x, target)
    finally:
        for h in hooks:
            h.remove()
    assert abs(att.total - att.logit_diff) < 1e-4
    run = readouts.run(model, x)
    f, _, _ = readouts.frozen(model.net.norm, run.states[-1][-1])
    W = model.net.lm_head.weight[target].float()
    for i in range(model.cfg.n_layers):
        assert abs(float(f(branch[i]) @ W) - float(att.mlps[i])) < 1e-4, i
    if not model.cfg.final_softcap:
        assert abs(att.logit_diff - float(model.trace(x).logits[-1, target])) < 1e-4


@pytest.mark.parametrize("variant", [None, Variant("local", window=3)])
def test_cached_generation_equals_a_full_rerun(model, variant):
    net, x = model.net, ids(9)
    L = model.cfg.n_layers
    with torch.inference_mode():
        emb = net.embed_text(x[None])
        full = net.run_blocks(emb, capture=range(L), variants=variant)
        cache = [{} for _ in range(L)]
        net.run_blocks(emb[:, :5], cache=cache, variants=variant)
        for t in range(5, 9):
            step = net.run_blocks(emb[:, t:t + 1], capture=range(L), cache=cache, offset=t, variants=variant)
            assert (step.x[0, 0] - full.x[0, t]).abs().max() < 1e-5
            for i in range(L):
                assert (step.weights[i][0, :, 0] - full.weights[i][0, :, t, : t + 1]).abs().max() < 1e-5


def test_generation_greedy_steps_match_the_trace(model):
    gen = generation.generate(model, ids(6).tolist(), 4, stop_at_eos=False)
    seq = list(gen.prompt_ids)
    for step in gen.steps:
        tr = model.trace(seq)
        assert step.top_ids[0] == int(tr.logits[-1].argmax())
        assert (step.attention - tr.attentions[:, :, -1]).abs().max() < 1e-5
        seq.append(step.token)


def test_logit_lens_last_row_is_the_models_logits(model):
    x = ids()
    if not all(block.additive for block in model.net.blocks):
        with pytest.raises(ValueError, match="pre-norm"):
            readouts.logit_lens(model, x)
        return
    lens = readouts.logit_lens(model, x)
    tr = model.trace(x)
    assert lens.top_ids[-1, :, 0].tolist() == tr.logits.argmax(-1).tolist()


def test_head_mask_prune_and_mean_ablation_agree(model):
    x = ids()
    keep = torch.ones(model.cfg.n_layers, model.cfg.n_heads, dtype=torch.bool)
    keep[1, 0] = keep[0, 3] = False
    masked, pruned = model.trace(x, head_mask=keep.float()), model.prune(keep).trace(x)
    assert (masked.logits - pruned.logits).abs().max() < 1e-4
    assert (masked.attentions[keep] - pruned.attentions[keep]).abs().max() < 1e-5


def test_every_language_model_family_has_a_row():
    lms = [n for n, f in REGISTERED.items() if f.TASK == "lm"]
    assert all(any(row == n or row.startswith(n + "_") for row in FAMILIES) for n in lms), lms


def test_patching_the_only_difference_restores_the_clean_run(model):
    """The corrupted prompt differs from the clean one in one token: patching the clean residual
    into block 0 there makes the runs identical (recovered exactly 1), through every family's
    windows, norms and caps; every head's output patch gives a finite score."""
    from attnviz.analysis import patching
    clean = ids()
    corrupted = clean.clone()
    corrupted[-2] = (int(clean[-2]) + 1) % 99      # within every tiny window of the last token
    if not all(block.additive for block in model.net.blocks):
        with pytest.raises(ValueError, match="pre-norm"):
            patching.prepare(model, clean, corrupted, target=3, minus=4)
        return
    pair = patching.prepare(model, clean, corrupted, target=3, minus=4)
    restored = patching.patch_map(model, pair, "resid_pre", units={0: [LONG - 2]})
    assert abs(float(restored.recovered[0, LONG - 2]) - 1) < 1e-4
    heads = patching.patch_map(model, pair, "z", units={1: list(range(model.cfg.n_heads))})
    assert torch.isfinite(heads.recovered[1]).all()


def test_mean_ablation_by_a_heads_own_mean_changes_nothing(model):
    """On one token every head's output is its value at that token, so its mean over that text is
    itself: mean-ablating every head with those means gives the model's own logits exactly."""
    from attnviz.analysis import head_ablation
    x = ids(1)
    means = head_ablation.head_means(model, x)
    off = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
    ablated = head_ablation.logits(model, x, off, "mean", means)
    assert (ablated - model.trace(x).logits).abs().max() < 1e-5
    assert (head_ablation.logits(model, x, off, "zero") - model.trace(x).logits).abs().max() > 1e-4


# ---------------------------------------------------------------- encoders
# The analyses an encoder has (step-by-step head, long capture, masks, pruning and mean ablation),
# on every encoder family's tiny model: the padding offset, the projected embeddings and a
# relative-position bias reach them through the blocks, as a decoder's windows do.
@pytest.fixture(scope="module", params=list(ENCODERS))
def encoder(request):
    return attnviz.from_hf(tiny(request.param))


def test_encoder_step_by_step_head_equals_the_trace(encoder):
    x = ids()
    assert head_recompute.verify(encoder, x) < 1e-5
    tr = encoder.trace(x, states=True, layers=[1])
    steps = head_recompute.head_steps(encoder, tr, 1, 2)
    assert steps.output_diff < 1e-5
    if encoder.cfg.rel_buckets or encoder.cfg.disentangled:   # the position terms, viewable apart,
        bias = steps.steps["position_bias"].value                      # are what the scores add
        scaled = steps.steps["scores"].value * encoder.cfg.scale + bias
        assert (steps.steps["scaled"].value - scaled).abs().max() < 1e-5
        assert (bias[:, None] - bias[None, :]).abs().max() > 0   # it depends on the distance
        terms = [steps.steps[t].value for t in encoder.cfg.disentangled]
        if terms:   # DeBERTa: content→position and position→content, each apart, add up to the bias
            assert (sum(terms) - bias).abs().max() < 1e-6


def test_encoder_long_capture_equals_the_trace(encoder, monkeypatch):
    x = ids()
    full = encoder.trace(x).attentions
    for floats in (capture.CHUNK_FLOATS, 4 * LONG * 5):
        monkeypatch.setattr(capture, "CHUNK_FLOATS", floats)
        got = capture.capture_text(encoder, x, max_window=LONG)
        assert (got.attentions - full).abs().max() < 1e-5, floats


def test_encoder_head_mask_prune_and_mean_ablation_agree(encoder):
    from attnviz.analysis import head_ablation
    x = ids()
    keep = torch.ones(encoder.cfg.n_layers, encoder.cfg.n_heads, dtype=torch.bool)
    keep[1, 0] = keep[0, 3] = False
    masked, pruned = encoder.trace(x, head_mask=keep.float()), encoder.prune(keep).trace(x)
    assert (masked.hidden - pruned.hidden).abs().max() < 1e-4
    assert (masked.attentions[keep] - pruned.attentions[keep]).abs().max() < 1e-5
    if encoder.trace(x).logits is not None:   # a masked-LM head: mean ablation by each head's own mean
        one = ids(1)
        off = torch.zeros(encoder.cfg.n_layers, encoder.cfg.n_heads)
        ablated = head_ablation.logits(encoder, one, off, "mean", head_ablation.head_means(encoder, one))
        assert (ablated - encoder.trace(one).logits).abs().max() < 1e-5


def test_every_encoder_family_has_a_row():
    encoders = [n for n, f in REGISTERED.items() if f.TASK == "encoder" and n != "bert"]
    assert all(any(row == n or row.startswith(n + "_") for row in ENCODERS) for n in encoders), encoders


# ---------------------------------------------------------------- vision
# The analyses of the Images page (step-by-step head, CLS and patch maps, rollout, distances,
# high-norm patches, masks and pruning) on every vision family's tiny model, each checked against
# the trace by hand: the distillation token (DeiT), a per-layer relative bias (BEiT), no CLS
# (SigLIP's tower) and the towers beside the image (CLIP and SigLIP's text, BLIP's text over the
# image) reach them through the blocks.
VISION_ROWS = ["vit", "dinov2", *VISION, *DUAL, "blip"]
PREFIX = {"deit": 2, "siglip": 0}   # tokens before the patches (default: CLS alone)


@functools.cache
def vision_row(row: str):
    if row in DUAL:
        return row, attnviz.from_hf(tiny_dual(row), dual_tokenizer(row))
    if row == "blip":
        return row, attnviz.from_hf(tiny_blip(), blip_tokenizer())
    return row, attnviz.from_hf(tiny(row))


@pytest.fixture(scope="module", params=VISION_ROWS)
def vision_model(request):
    return vision_row(request.param)


@pytest.fixture(scope="module", params=[*DUAL, "blip"])
def towers(request):
    return vision_row(request.param)


def photo(model):
    torch.manual_seed(2)
    return torch.randn(3, model.cfg.image_size, model.cfg.image_size)


def test_vision_step_by_step_head_equals_the_trace(vision_model):
    row, model = vision_model
    x = photo(model)
    assert head_recompute.verify(model, x) < 1e-5
    tr = model.trace(x, states=True, layers=[1])
    steps = head_recompute.head_steps(model, tr, 1, 2)
    assert steps.output_diff < 1e-5
    if model.cfg.rel_pos_bias:   # BEiT's bias by 2-D patch offset, viewable apart, is what the scores add
        bias = steps.steps["position_bias"].value
        scaled = steps.steps["scores"].value * model.cfg.scale + bias
        assert (steps.steps["scaled"].value - scaled).abs().max() < 1e-5


def test_patch_maps_rollout_and_distances_read_the_traces_rows(vision_model):
    row, model = vision_model
    tr = model.trace(photo(model), states=True)
    A, p, (gh, gw) = tr.attentions, tr.n_prefix, tr.grid
    assert p == PREFIX.get(row.split("_")[0], 1) and (gh, gw) == (4, 4) and tr.n == p + 16
    L, H = A.shape[:2]
    grid = lambda rows: rows[..., p:].reshape(*rows.shape[:-1], gh, gw)   # noqa: E731
    assert torch.equal(vision.cls_maps(tr), grid(A[:, :, 0] if p else A.mean(2)))
    assert torch.equal(vision.patch_query_maps(tr, 1, 2), grid(A[:, :, p + 1 * gw + 2]))
    flow = torch.eye(tr.n)                              # rollout: 0.5 A + 0.5 I per layer, bottom up
    for layer in A:
        step = 0.5 * layer.mean(0) + 0.5 * torch.eye(tr.n)
        flow = (step / step.sum(-1, keepdim=True)) @ flow
    close(vision.rollout_map(tr), grid(flow[0] if p else flow.mean(0)), 1e-6)
    want = torch.zeros(L, H)                            # mean distance between patch centres, in pixels
    centres = torch.tensor([[r, c] for r in range(gh) for c in range(gw)], dtype=torch.float32)
    far = torch.cdist(centres, centres) * model.cfg.patch_size
    for i in range(L):
        for h in range(H):
            w = A[i, h, p:, p:]
            want[i, h] = ((w / w.sum(-1, keepdim=True)) * far).sum(-1).mean()
    close(vision.attention_distance_px(tr, model.cfg.patch_size), want, 1e-4)
    found = vision.find_artefacts(tr)   # the input of the last block, on the patch grid
    close(found.norms, tr.states[-2][p:].norm(dim=-1).reshape(gh, gw), 1e-6)


def test_vision_head_mask_prune_and_mask_effect_agree(vision_model):
    row, model = vision_model
    x = photo(model)
    keep = torch.ones(model.cfg.n_layers, model.cfg.n_heads, dtype=torch.bool)
    keep[1, 0] = keep[0, 3] = False
    full, masked, pruned = model.trace(x), model.trace(x, head_mask=keep.float()), model.prune(keep).trace(x)
    assert (masked.hidden - pruned.hidden).abs().max() < 1e-4
    assert (masked.attentions[keep] - pruned.attentions[keep]).abs().max() < 1e-5
    assert (masked.attentions - full.attentions).abs().max() > 0   # layer 0's heads off change layer 1
    effect = vision.mask_effect(full, masked, keep.float())
    want = torch.nn.functional.cosine_similarity(full.hidden[0].double(), masked.hidden[0].double(), dim=0)
    assert effect.heads_off == 2 and abs(effect.cls_cosine - float(want)) < 1e-9
    assert vision.mask_effect(full, model.trace(x)).cls_cosine == pytest.approx(1.0)


def test_the_towers_beside_the_image_are_read_from_their_traces(towers):
    """CLIP and SigLIP: each caption's trace is the text tower's (causal for CLIP), its step-by-step
    head equals it, and what the pooled tokens read are rows of the traces; BLIP: each word's map
    over the patches is its cross-attention row, the prefix left out."""
    row, model = towers
    x = photo(model)
    if row in DUAL:
        match = model.match(x, CAPTIONS)
        for caption, text, i, reads in zip(CAPTIONS, match.texts, match.pooled, match.text_reads):
            ids = model.caption_ids(caption)
            assert torch.equal(text.attentions, model.text_model.trace(ids).attentions)
            assert head_recompute.verify(model.text_model, ids) < 1e-5
            assert torch.equal(reads, text.attentions[:, :, i])
            causal = text.attentions.triu(1).abs().max() == 0
            assert causal == model.joint.text.causal
        if not match.probe:
            assert torch.equal(match.image_reads, match.image.attentions[:, :, 0])
    else:
        reading = model.read(x, "a photo of cat on the mat")
        p, (gh, gw) = reading.image.n_prefix, reading.image.grid
        cross = reading.cross_attentions
        assert torch.equal(reading.patch_attentions, cross[..., p:].reshape(*cross.shape[:-1], gh, gw))
        close(cross.sum(-1), torch.ones(cross.shape[:-1]))
        assert torch.equal(reading.image.attentions, model.trace(x).attentions)


def test_every_vision_family_has_a_row():
    kinds = [n for n, f in REGISTERED.items() if f.TASK == "vision"]
    assert all(any(row == n or row.startswith(n + "_") for row in VISION_ROWS) for n in kinds), kinds
