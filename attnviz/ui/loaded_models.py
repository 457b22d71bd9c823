"""Which shared models this server holds, how much memory their weights take, and which one the
next load drops: the shared models are kept by count (LIMITS.model_cache_entries), least recently
used dropped, so a walk through the pages can reload one; the first load of a model says so."""
from __future__ import annotations

from attnviz.base.limits import LIMITS

IN_MEMORY: dict[str, int] = {}  # model -> float32 bytes of its weights, least recently used first


def note(name: str, model) -> str:
    """Mark `name` as just used and say what is held (plain text: escape it before markdown)."""
    IN_MEMORY.pop(name, None)
    IN_MEMORY[name] = 4 * model.num_params()
    while len(IN_MEMORY) > LIMITS.model_cache_entries:
        IN_MEMORY.pop(next(iter(IN_MEMORY)))
    held = ", ".join(f"{k} ({b / 2**20:,.0f} MB)" for k, b in reversed(IN_MEMORY.items()))
    full = len(IN_MEMORY) >= LIMITS.model_cache_entries
    return (f"In memory on this server: {held}; {sum(IN_MEMORY.values()) / 2**20:,.0f} MB in all. At most "
            f"{LIMITS.model_cache_entries} models stay loaded" + (
                f": loading another drops {next(iter(IN_MEMORY))}, which then loads again when a page needs it."
                if full else "."))
