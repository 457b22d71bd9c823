"""The sentences the pages write for the bundled samples (Heads, Corpus, Images, Latency), computed by
the same library calls the pages make. Prints them; asserts nothing. Timings in them are this
machine's (a loaded one gives other numbers).

    PYTHONPATH=$PWD .venv/bin/python bench/newcomer_sentences.py
"""
from __future__ import annotations

import dataclasses

import torch

from attnviz.analysis import corpus, corpus_runs, effects, head_answers, importance, pruning, vision
from attnviz.latency import int8_story, latency_answers, sweep, tradeoff
from attnviz.uploads import images
from attnviz.weights.catalogue import load_model

SENTENCES = ["A kitten is resting on a rug.", "The dog sleeps on the sofa.", "A man is playing a guitar.",
             "Stock markets fell sharply today.", "The cat is lying on a carpet."]


def heads_live():
    m = load_model("minilm")
    ids = m.encode_text("The cat sits on the mat.")[0].tolist()
    keep = torch.ones(6, 12, dtype=torch.bool)
    keep[5, 3] = False
    full = effects.outputs(m, ids, None, 5, SENTENCES)
    masked = effects.outputs(m, ids, keep.float(), 5, SENTENCES)
    cmp = effects.output_change(full, masked, SENTENCES)
    print("Heads (minilm, L5H3 off):", head_answers.mask_sentence(1, 72, "cosine", cmp["cosine"], 1.0))
    lm = load_model("smollm2")
    text = "The capital of France is Paris. The cat sat on the mat because it was tired, and"
    ids = lm.encode_text(text)[0].tolist()
    keep = torch.ones(30, 9, dtype=torch.bool)
    keep[0, 1] = False
    full, masked = effects.outputs(lm, ids, None, 29, []), effects.outputs(lm, ids, keep.float(), 29, [])
    cmp = effects.output_change(full, masked, [])
    print("Heads (smollm2, L0H1 off):", head_answers.mask_sentence(1, 270, "top1", cmp["top1"], 1.0,
                                                                     cmp["flipped_positions"], len(ids)))
    data = importance.eval_windows(m, None, 256, 64)
    curve = pruning.pruning_curve(m, data, seeds=(0, 1, 2))
    print("Heads pruning curve (minilm, Alice 256 tokens):", head_answers.curve_sentence(curve.summary(), "cosine", 72))


def corpus_runs_said():
    c = corpus.open_corpus("alice-sentences")
    c = dataclasses.replace(c, items=c.items[:20], labels=None)
    r = corpus_runs.run("minilm", c, "pruning_curve")
    print("Corpus pruning curve (minilm, 20 sentences):", head_answers.corpus_curve_sentence(r.summary, "cosine", 72, 20))
    r = corpus_runs.run("minilm", c, "heads_4_vs_8")
    priced = tradeoff.kept_heads_latency(load_model("minilm").cfg, r.extra["keep"], int(r.extra["tokens"]))
    print("Corpus halving (minilm, 20 sentences):",
          latency_answers.halved_sentence(r.summary, "cosine", "embedding cosine", 12, priced, 20))


def images_said():
    m = load_model("dinov2")
    name, path = next(iter(images.sample_images().items()))
    photo = images.open_image(path.read_bytes())
    mask = torch.ones(m.cfg.n_layers, m.cfg.n_heads)
    mask[11, :3] = 0
    before, after = m.trace(photo), m.trace(photo, head_mask=mask)
    e = vision.mask_effect(before, after, mask)
    print(f"Images (dinov2, {name}, L11H0-2 off):", head_answers.image_mask_sentence(
        e.cls_cosine, e.saliency_iou, e.saliency_mean_abs_change, 3, int(mask.numel())))


def latency_said():
    print("Latency 4 vs 8:", latency_answers.heads_tradeoff_sentence(tradeoff.heads_table()))
    plan = sweep.SweepPlan(models=["minilm"], seq_lens=[16, 32, 64, 128, 256], backends=["cpu", "pi4", "pi5"],
                           repeats=3).check()
    df = sweep.run_sweep(plan, {"minilm": load_model("minilm")}, quiet=True)
    print("Latency sweep (the page's default):", latency_answers.sweep_sentence(df))
    table = int8_story.int8_table(["minilm", "smollm2"], load_model)
    for _, row in table.iterrows():
        print("Latency int8:", int8_story.int8_sentence(row))
    print("  ", int8_story.why(table))


if __name__ == "__main__":
    for part in (heads_live, corpus_runs_said, images_said, latency_said):
        part()
