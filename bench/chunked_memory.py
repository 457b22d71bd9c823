"""Chunked exact attention at n = 8192 against the naive (eager) path: peak memory ratio.

Target (issue #6): chunked needs at most 1/8 of the naive peak. Memory is torch's CPU allocations
while the call runs (attnviz.latency.measure.peak_memory_mb), so the ratio is deterministic, not timed.
Also checks that both give the same output (1e-5) and prints one-layer model figures.
"""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from attnviz.core.attention import EAGER, attend, parse_variant  # noqa: E402
from attnviz.latency.measure import load, model_inputs, peak_memory_mb  # noqa: E402

N, HEADS, D_HEAD, CHUNK = 8192, 2, 64, 256


def main() -> int:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, N, D_HEAD) for _ in range(3))
    chunked = parse_variant(f"chunked:{CHUNK}")
    worst = 0.0
    print(f"attention only: n={N}, {HEADS} heads x {D_HEAD}, chunk {CHUNK}")
    for causal in (False, True):
        naive = peak_memory_mb(lambda: attend(q, k, v, causal=causal, variant=EAGER), quiet=True)
        small = peak_memory_mb(lambda: attend(q, k, v, causal=causal, variant=chunked), quiet=True)
        with torch.inference_mode():
            diff = (attend(q, k, v, causal=causal, variant=EAGER)[0]
                    - attend(q, k, v, causal=causal, variant=chunked)[0]).abs().max().item()
        ratio = small / naive
        worst = max(worst, ratio)
        print(f"  causal={causal!s:5}  naive {naive:8.1f} MB  chunked {small:6.1f} MB  "
              f"ratio {ratio:.4f} (1/{1 / ratio:.0f})  max |diff| {diff:.1e}")
    model = load(f"synthetic:layers=1,d=128,heads={HEADS},ff=512,positions={N}")
    inputs, _ = model_inputs(model, N)
    peaks = {name: peak_memory_mb(lambda: model.net(**inputs, variants=parse_variant(name)), quiet=True)
             for name in ("eager", f"chunked:{CHUNK}", "fused")}
    print("one-layer model (d=128): " + ", ".join(f"{k} {v:.1f} MB" for k, v in peaks.items())
          + f"; chunked/eager {peaks[f'chunked:{CHUNK}'] / peaks['eager']:.4f}")
    ok = worst <= 1 / 8
    print(f"target chunked <= 1/8 of naive: {'met' if ok else 'NOT met'} (worst ratio {worst:.4f})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
