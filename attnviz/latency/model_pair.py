"""Two real decoders priced side by side on a Raspberry Pi by the cost model: the shapes that set
their attention cost (layers, query heads, K/V heads, head width, local windows) and what a prompt
and each generated token cost at a few lengths. Gemma 3 270M (4 query heads sharing 1 K/V head,
256 wide, 15 of 18 layers local to 512 keys) beside SmolLM2-135M (9 query heads, 3 K/V heads, 64
wide, every layer global): "fewer, wider heads" in two models that exist.
"""
from __future__ import annotations

import pandas as pd

from attnviz.core.config import Config
from attnviz.latency import costmodel, decode
from attnviz.latency.costmodel import PROFILES

PAIR = ("gemma3-270m", "smollm2")
LENGTHS = (128, 512, 2048)
PI_THREADS = 4
BAND = 0.25     # the cost model's stated error on a Pi (±25 %), carried beside each figure


def shapes(configs: dict[str, Config]) -> pd.DataFrame:
    """One row per model: the fields that set its attention cost."""
    rows = []
    for key, cfg in configs.items():
        local = [w for w in (cfg.windows or ()) if w]
        rows.append({"model": key, "layers": cfg.n_layers, "query heads": cfg.n_heads,
                     "K/V heads": cfg.n_kv_heads, "head width": cfg.d_head, "d_model": cfg.d_model,
                     "local layers": f"{len(local)} (window {max(local)})" if local else "none",
                     "weights MB (fp32)": round(costmodel.weights_mb(cfg), 1)})
    return pd.DataFrame(rows)


def pi_prices(configs: dict[str, Config], lengths=LENGTHS, devices=tuple(PROFILES),
              threads: int = PI_THREADS) -> pd.DataFrame:
    """Modelled Pi cost per model, device and length n: the n-token prompt in one pass (ms, and
    attention's share of it; the output layer on its last token only) and one generated token
    with n tokens already cached (ms, and the output layer's share of it: one row per vocabulary
    entry, 262,144 for Gemma against SmolLM2's 49,152)."""
    rows = []
    for key, cfg in configs.items():
        for device in devices:
            profile = PROFILES[device]
            for n in lengths:
                ops = decode.prefill_ops(cfg, n)        # the LM head on the last token only, as llama.cpp
                prompt_s = decode.seconds(ops, profile, threads)
                attention_s = decode.seconds([(op, c) for op, c in ops if op.group == "attention"], profile, threads)
                step = decode.decode_ops(cfg, n)
                step_s = decode.seconds(step, profile, threads)
                output_s = decode.seconds([(op, c) for op, c in step if op.name == "LM head"], profile, threads)
                rows.append({"model": key, "device": device, "tokens": n, "prompt ms": prompt_s * 1e3,
                             "attention share": attention_s / prompt_s, "next token ms": step_s * 1e3,
                             "output layer share": output_s / step_s})
    return pd.DataFrame(rows)


def verdict(prices: pd.DataFrame, a: str, b: str, device: str = "pi4", n: int = 512) -> str:
    """One sentence comparing model ``a`` with ``b`` on ``device`` at ``n`` tokens."""
    at = prices[(prices["device"] == device) & (prices["tokens"] == n)].set_index("model")
    pa, pb = at.loc[a, "prompt ms"], at.loc[b, "prompt ms"]
    ta, tb = at.loc[a, "next token ms"], at.loc[b, "next token ms"]
    board = {"pi4": "Pi 4", "pi5": "Pi 5"}.get(device, device)
    return (f"On a {board} ({PI_THREADS} threads, modelled, ±{BAND:.0%}), a {n}-token prompt costs {a} "
            f"{pa:,.0f} ms against {pb:,.0f} ms for {b} ({pa / pb:.2f}×), and each next token "
            f"{ta:,.1f} ms against {tb:,.1f} ms ({ta / tb:.2f}×); attention is {at.loc[a, 'attention share']:.0%} "
            f"of {a}'s prompt and {at.loc[b, 'attention share']:.0%} of {b}'s, and the output layer "
            f"{at.loc[a, 'output layer share']:.0%} and {at.loc[b, 'output layer share']:.0%} of a next token.")
