"""int8 in one place: per model, the speed-up modelled on each Pi (with the cost model's band), the
speed-up measured on this CPU, and what int8 keeps of the output, with the reason x86 and ARM differ.

    table = int8_table(["minilm"], loader=load_model)   # loads, quantizes and times: seconds a model
    int8_sentence(table.iloc[0])                        # "minilm, int8: 1.37× faster on a Pi 4 ..."

The Pi columns price the model's own shape with the torch int8 profile against torch fp32 (4 threads,
`TOKENS` tokens); translators and speech models have their own cost models (blank here). The measured
column is `quantize.latency_ratio` inverted (above 1 is faster). Missing cells are "" so a table never
shows "None".
"""
from __future__ import annotations

import pandas as pd

from attnviz.core.config import Config
from attnviz.latency import quantize
from attnviz.latency.costmodel import predict
from attnviz.latency.engines import engine_profile
from attnviz.latency.latency_answers import DEVICES, PI_BAND

TOKENS = 128
PI_THREADS = 4
SLOWER_HERE = ("Why x86 and ARM differ: on a Pi, int8 streams a quarter of the weight bytes over a narrow memory bus and "
       "ARM's int8 kernels (XNNPACK / QNNPACK with NEON) are fast, so the pass speeds up; on this x86 CPU the float32 "
       "matrix products already run at full speed from a large cache, while torch's dynamic int8 quantizes every "
       "activation at each call, an overhead that a short batch-1 pass does not win back.")
FASTER_HERE = ("Here int8 measured faster too: torch's x86 int8 kernels (FBGEMM, with VNNI where the CPU has it) "
               "can beat float32 when the weights no longer fit the cache, and on a shared machine a float32 pass "
               "slowed by other work makes int8 look better; the Pi's gain comes from its narrow memory bus and ARM's "
               "int8 kernels, so the two speed-ups need not agree. Measure again on a quiet machine before relying on it.")
FIDELITY_DIGITS = 3


def why(table: pd.DataFrame) -> str:
    """Why this CPU's int8 speed-up differs from the Pi's, for what was measured here."""
    col = "this CPU int8 speed-up (measured)"
    measured = [float(c.rstrip("×")) for c in table.get(col, []) if c]
    return SLOWER_HERE if any(x < 1 for x in measured) else FASTER_HERE


def modelled_speedup(cfg, device: str, tokens: int = TOKENS) -> float | None:
    """float32 ms / int8 ms on the device (torch engine, the Pi's 4 threads); None where the Pi cost
    model does not price this kind of model."""
    if type(cfg) is not Config:
        return None
    fp32, int8 = (predict(cfg, tokens, engine_profile(device, "torch", d), "eager", threads=PI_THREADS).total_ms
                  for d in ("fp32", "int8"))
    return fp32 / int8


def times(x: float | None) -> str:
    """"1.37×" or "" for a missing figure."""
    return "" if x is None else f"{x:.2f}×"


def fidelity_text(fid: dict) -> str:
    return ", ".join(f"{k} {v:.{FIDELITY_DIGITS}f}" if isinstance(v, float) else f"{k} {v}" for k, v in fid.items())


def int8_table(keys, loader, rounds: int = 3, check=None, with_bf16: bool | None = None) -> pd.DataFrame:
    """One row per model: Pi 4 / Pi 5 int8 speed-up (modelled, with the ±25 % band), this CPU's int8
    (and bf16, where the CPU has it) speed-up measured, and the int8 copy's fidelity. `check` runs
    before each model and copy (a Cancel's), and raises to stop."""
    bf16 = quantize.has_bf16() if with_bf16 is None else with_bf16
    rows = []
    for key in keys:
        if check is not None:
            check()
        model = loader(key)
        ref = quantize.reference(model)
        row = {"model": key}
        for device, name in DEVICES.items():
            if device == "cpu":
                continue
            s = modelled_speedup(model.cfg, device)
            row[f"{name} int8 speed-up (modelled)"] = times(s)
            row[f"{name} band (±{PI_BAND:.0%})"] = "" if s is None else \
                f"{times(s * (1 - PI_BAND))}–{times(s * (1 + PI_BAND))}"
        fid = {}
        for mode in ("int8", "bf16") if bf16 else ("int8",):
            if check is not None:
                check()
            twin = quantize.quantized_copy(model, mode)
            row[f"this CPU {mode} speed-up (measured)"] = times(1 / quantize.latency_ratio(model, twin, rounds))
            if mode == "int8":
                fid = quantize.fidelity(model, twin, ref)
            del twin
        row["int8 fidelity"] = fidelity_text(fid)
        rows.append(row)
    return pd.DataFrame(rows).fillna("")


def _speed(cell: str) -> str:
    x = float(cell.rstrip("×"))
    return f"{x:.2f}× faster" if x >= 1 else f"{1 / x:.2f}× slower"


def int8_sentence(row) -> str:
    """One model's int8 story in one sentence, built from its table row."""
    parts = []
    for name in ("Pi 4", "Pi 5"):
        cell = row.get(f"{name} int8 speed-up (modelled)", "")
        if cell:
            parts.append(f"{_speed(cell)} on a {name} (modelled, ±{PI_BAND:.0%}: {row[f'{name} band (±{PI_BAND:.0%})']})")
    here = row.get("this CPU int8 speed-up (measured)", "")
    if here:
        parts.append(f"{_speed(here)} on this CPU (measured)")
    text = f"{row['model']}, int8: " + ("; ".join(parts) if parts else "no speed figure")
    if row.get("int8 fidelity"):
        text += f"; it keeps {row['int8 fidelity']}"
    return text + "."
