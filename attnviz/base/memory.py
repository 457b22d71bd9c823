"""Memory, decided before the work: the one estimate of an attention capture, and the server's guard.

An attention capture grows with the square of the tokens in every layer: a view that keeps
[L, H, n, n] float32 weights (two prompts side by side, a prompt pass that records every layer,
the Attention page's short texts) holds 4 * L * H * n^2 bytes; SmolLM2 (30 x 9) at 8,192 tokens
would ask for 72 GB in one buffer. `plan_capture` prices such a capture from its shape alone and
decides, for every view the same way:

- "full" when it fits `LIMITS.max_capture_mb`;
- "chunked" above that when the caller can capture layer by layer or query chunk by query chunk
  (it then holds one chunk of one layer at a time, not the whole);
- otherwise a ValueError that names the capture, its size, the budget, and the longest input that
  fits: what the user should shorten, before a single block runs.

`check_room(what, need)`: the process's resident memory now plus `need` bytes must stay within
`LIMITS.max_memory_mb` (0: three quarters of the machine's memory). One process serves every
browser session, so a job that would push it past that is refused before it starts, with a message,
instead of every user's app being taken down by the kernel's OOM killer. Every heavy job checks it
(`jobs.heavy_job`) and so does every capture priced here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import psutil

from attnviz.base.limits import LIMITS

FLOAT_BYTES = 4
MB = 2**20


def _mb(n_bytes: float) -> str:
    return f"{n_bytes / MB:,.0f} MB" if n_bytes < 10 * 2**30 else f"{n_bytes / 2**30:,.0f} GB"


def rss_bytes() -> int:
    """This process's resident memory now."""
    return psutil.Process().memory_info().rss


def memory_budget_bytes() -> int:
    """`LIMITS.max_memory_mb`, or three quarters of the machine's memory when it is 0."""
    if LIMITS.max_memory_mb > 0:
        return int(LIMITS.max_memory_mb * MB)
    return int(psutil.virtual_memory().total * 0.75)


def check_room(what: str, need_bytes: float = 0) -> None:
    """ValueError when this process's memory plus `need_bytes` would pass the server's budget."""
    now, budget = rss_bytes(), memory_budget_bytes()
    if now + need_bytes > budget:
        extra = f" and {what} needs about {_mb(need_bytes)} more" if need_bytes else ""
        raise ValueError(f"the server is short of memory: it holds {_mb(now)}{extra}, and it keeps within "
                         f"{_mb(budget)} for all its users. Try {what} again later, or with a shorter input.")


def capture_bytes(layers: int, heads: int, queries: int, keys: int | None = None, copies: int = 1) -> int:
    """Bytes of `copies` float32 attention captures of shape [layers, heads, queries, keys]."""
    keys = queries if keys is None else keys
    return int(copies) * int(layers) * int(heads) * int(queries) * int(keys) * FLOAT_BYTES


@dataclass(frozen=True)
class CapturePlan:
    mode: str          # "full" or "chunked"
    bytes: int         # what the whole capture would take
    budget: int        # the byte budget it was priced against
    longest: int       # the most tokens whose whole capture fits the budget


def longest_fitting(budget: int, layers: int, heads: int, copies: int = 1, rows: int | None = None) -> int:
    """The most tokens n whose capture (n x n per head, or rows x n when `rows` is fixed) fits `budget`."""
    per_token = FLOAT_BYTES * max(1, copies * layers * heads)
    if rows is not None:
        return budget // (per_token * max(1, rows))
    return math.isqrt(budget // per_token)


def plan_capture(what: str, *, layers: int, heads: int, n: int, keys: int | None = None, rows: int | None = None,
                 copies: int = 1, chunked: bool = False, shorten: str = "the text",
                 budget_mb: float | None = None, chunk_bytes: int = 0) -> CapturePlan:
    """Decide how a capture of `copies` x [layers, heads, rows or n, keys or n] float32 weights runs
    (see the module docstring). `chunked`: the caller can capture it piece by piece, holding
    `chunk_bytes` at a time; `budget_mb`: a view's own budget (LIMITS.max_capture_mb when None)."""
    budget = int((LIMITS.max_capture_mb if budget_mb is None else budget_mb) * MB)
    keys = n if keys is None else keys
    size = capture_bytes(layers, heads, n if rows is None else rows, keys, copies)
    longest = longest_fitting(budget, layers, heads, copies, rows)
    if size <= budget:
        check_room(what, size)
        return CapturePlan("full", size, budget, longest)
    if chunked:
        check_room(what, min(size, budget + chunk_bytes))
        return CapturePlan("chunked", size, budget, longest)
    raise ValueError(f"{what} of {n:,} tokens would hold {_mb(size)} of attention weights ({layers} layers x "
                     f"{heads} heads x {n if rows is None else rows:,} x {keys:,}{f' x {copies}' if copies > 1 else ''}); this server keeps a "
                     f"capture within {_mb(budget)}. Shorten {shorten} to at most {max(longest, 1):,} tokens.")
