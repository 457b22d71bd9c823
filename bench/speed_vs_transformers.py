"""Our trace vs transformers on the same weights and tokens, side by side in one process.

Prints, for MiniLM and SmolLM2 at 128 tokens, the median over alternating pairs of
  ours (trace with attention weights) / transformers eager with output_attentions, and
  ours (fast path, fused attention)   / transformers SDPA.
Target: both ratios <= 0.9. Timings on a shared machine are noisy; the ratio is what counts.
"""
from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import attnviz  # noqa: E402
from attnviz.base.timing import measure  # noqa: E402


def reference(key: str, model: attnviz.Model, impl: str):
    import transformers as tf
    from attnviz.weights import catalogue
    from attnviz.weights.gguf import read_gguf
    if key == "minilm":
        return tf.AutoModel.from_pretrained(str(catalogue.bundled_path("minilm")), attn_implementation=impl).eval()
    cfg, state = read_gguf(catalogue.bundled_path("smollm2"))
    ref = tf.LlamaForCausalLM(tf.LlamaConfig(**cfg, attn_implementation=impl)).eval()
    ref.load_state_dict(state, strict=False)
    ref.tie_weights()
    return ref


def timed(fn) -> float:
    """Seconds of one call, by the one timer (one call at a time: the pairs alternate)."""
    return measure(fn, 1, 0).times[0]


def pairs(ours, theirs, n: int) -> list[float]:
    for _ in range(2):  # warm-up both
        ours(), theirs()
    ratios = []
    for i in range(n):  # alternate which goes first so drift hits both
        if i % 2:
            b, a = timed(theirs), timed(ours)
        else:
            a, b = timed(ours), timed(theirs)
        ratios.append(a / b)
    return ratios


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="minilm,smollm2")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--pairs", type=int, default=15)
    args = ap.parse_args()
    torch.manual_seed(0)
    for key in args.models.split(","):
        model = attnviz.load_model(key)
        ids = torch.randint(1000, 20000, (args.tokens,))
        eager, sdpa = reference(key, model, "eager"), reference(key, model, "sdpa")
        with torch.inference_mode():
            check = model.trace(ids)
            ref_out = eager(input_ids=ids[None], output_attentions=True)
            diff = (check.attentions - torch.stack([a[0] for a in ref_out.attentions])).abs().max().item()
            r_weights = pairs(lambda: model.trace(ids),
                              lambda: eager(input_ids=ids[None], output_attentions=True), args.pairs)
            r_fast = pairs(lambda: model.trace(ids, attentions=False),
                           lambda: sdpa(input_ids=ids[None]), args.pairs)
        print(f"{key:8s} n={args.tokens}: with weights / eager+output_attentions = "
              f"{statistics.median(r_weights):.2f}   fast / SDPA = {statistics.median(r_fast):.2f}   "
              f"(median of {args.pairs} alternating pairs; max |Δattention| {diff:.1e})", flush=True)


if __name__ == "__main__":
    main()
