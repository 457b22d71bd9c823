"""How long a bundled model's first load will take, said before it starts (a newcomer picking SmolLM2
waited 45 s with nothing saying so).

The figures are rates per megabyte of the bundled file, measured on the project's 2-core machine: a
first start converts the checkpoint to this app's format and caches it (SmolLM2's 93 MB GGUF: about
45 s), a later one reads that cache (MiniLM 87 MB 7.8 s, SmolLM2 4.8 s, Gemma 3 253 MB 13.9 s, e5 72 MB
12.7 s, DINOv2 1.2 s, imports included). A guess, not a promise: it says "about" and the bar shows the stages.
"""
from __future__ import annotations

import math

from attnviz.weights import conversion_cache
from attnviz.weights.catalogue import BUNDLED

CONVERT_S_PER_MB = 0.5    # SmolLM2: 45 s for 93 MB, dequantising a GGUF and writing the cache
READ_S_PER_MB = 0.1       # reading the cache: 5-14 s for 90-250 MB on a loaded 2-core machine
MIN_S = 5


def converted_before(key: str) -> bool:
    """Whether this server's conversion cache holds a conversion of `key` (any version of its file)."""
    root = conversion_cache.cache_root()
    return root.is_dir() and any(root.glob(f"{key}-*/config.json"))


def seconds(key: str, converted: bool) -> int:
    rate = READ_S_PER_MB if converted else CONVERT_S_PER_MB
    return max(MIN_S, int(math.ceil(BUNDLED[key]["size_mb"] * rate / 5) * 5))


def expected(key: str) -> str | None:
    """One sentence on what this load costs, for a bundled model (None for a toy or a folder)."""
    if key not in BUNDLED:
        return None
    size = BUNDLED[key]["size_mb"]
    if converted_before(key):
        return (f"This takes about {seconds(key, True)} s ({size} MB read from this server's cache); every later "
                "page and session shares the copy.")
    return (f"The first load on this server takes about {seconds(key, False)} s: {size} MB converted to this app's "
            f"format once and cached (later starts: about {seconds(key, True)} s). The bar below shows each stage.")
