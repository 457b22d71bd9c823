"""How a figure is written in a sentence or a table, the same on every page.

- `ms(x)`: milliseconds to three significant figures (127 ms, 12.7 ms, 1.27 ms; 1,270 ms): a
  measurement on a busy CPU is not known to a hundredth of a millisecond, and "127.4836" hides that.
- `number(x, places)`: a metric, `places` decimals (large values, a perplexity, one decimal).
- `interval(lo, hi)`: " [95 % CI lo–hi]" beside a figure, or "" where it is unknown.
- `blank(x)`: a table cell: "" for a missing value, never "None" or "nan".
"""
from __future__ import annotations

import math


def ms(x) -> str:
    if x is None or not math.isfinite(float(x)):
        return ""
    x = float(x)
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{float(f'{x:.3g}'):g}"


def number(x, places: int = 3) -> str:
    x = float(x)
    return f"{x:,.1f}" if abs(x) >= 100 else f"{x:.{places}f}"


def interval(lo, hi, places: int = 3) -> str:
    if lo is None or hi is None or not (math.isfinite(float(lo)) and math.isfinite(float(hi))):
        return ""
    return f" [95 % CI {number(lo, places)}–{number(hi, places)}]"


def blank(x) -> str | float:
    """A cell that may be missing: "" for None / NaN, else the value itself."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return x
