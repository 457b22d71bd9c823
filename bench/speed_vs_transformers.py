"""Our trace vs transformers on the same weights and tokens, side by side in one process.

Prints, for MiniLM, SmolLM2 (llama), Gemma 3 270M (gemma3_text) and random models of Qwen2.5-0.5B's
and Pythia-160m's shapes (qwen2, gpt_neox; fewer layers, so a pair takes seconds) at 128 tokens, the
median over alternating pairs of
  ours (trace with attention weights) / transformers eager with output_attentions, and
  ours (fast path, fused attention)   / transformers SDPA.
Target: both ratios <= 0.9. Timings on a shared machine are noisy; the ratio is what counts.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import attnviz  # noqa: E402
from attnviz.base.timing import measure  # noqa: E402


# random models of real shapes, depth cut to keep a pair short: (config class, model class, fields)
SHAPES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=6, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        vocab_size=50304, hidden_size=768, intermediate_size=3072, num_hidden_layers=6, num_attention_heads=12,
        max_position_embeddings=2048, rope_parameters=dict(rope_theta=10000.0, partial_rotary_factor=0.25))),
}


def models(key: str):
    """(ours, transformers eager, transformers SDPA) on the same weights."""
    import transformers as tf
    from attnviz.weights import catalogue
    from attnviz.weights.gguf import read_gguf
    if key in SHAPES:
        config, cls, fields = SHAPES[key]
        eager = getattr(tf, cls)(getattr(tf, config)(**fields, attn_implementation="eager")).eval()
        ours = attnviz.from_hf(eager)
    elif key == "minilm":
        ours = attnviz.load_model(key)
        eager = tf.AutoModel.from_pretrained(str(catalogue.bundled_path("minilm")), attn_implementation="eager").eval()
    elif key == "gemma3-270m":
        ours = attnviz.load_model(key)
        path = catalogue.assembled_gguf(key)
        eager = tf.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                        attn_implementation="eager").eval()
    else:
        ours = attnviz.load_model(key)
        cfg, state = read_gguf(catalogue.bundled_path("smollm2"))
        eager = tf.LlamaForCausalLM(tf.LlamaConfig(**cfg, attn_implementation="eager")).eval()
        eager.load_state_dict(state, strict=False)
        eager.tie_weights()
    sdpa = copy.deepcopy(eager)
    sdpa.set_attn_implementation("sdpa")
    return ours, eager, sdpa


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
    ap.add_argument("--models", default="minilm,smollm2,gemma3-270m,qwen2,gpt_neox")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--pairs", type=int, default=15)
    args = ap.parse_args()
    torch.manual_seed(0)
    for key in args.models.split(","):
        model, eager, sdpa = models(key)
        ids = torch.randint(1000, 20000, (args.tokens,))
        with torch.inference_mode():
            check = model.trace(ids)
            ref_out = eager(input_ids=ids[None], output_attentions=True)
            diff = (check.attentions - torch.stack([a[0] for a in ref_out.attentions])).abs().max().item()
            r_weights = pairs(lambda: model.trace(ids),
                              lambda: eager(input_ids=ids[None], output_attentions=True), args.pairs)
            r_fast = pairs(lambda: model.trace(ids, attentions=False),
                           lambda: sdpa(input_ids=ids[None]), args.pairs)
        print(f"{key:11s} n={args.tokens}: with weights / eager+output_attentions = "
              f"{statistics.median(r_weights):.2f}   fast / SDPA = {statistics.median(r_fast):.2f}   "
              f"(median of {args.pairs} alternating pairs; max |Δattention| {diff:.1e})", flush=True)


if __name__ == "__main__":
    main()
