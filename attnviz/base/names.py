"""One vocabulary: the names of heads, and the keys of session state.

A head is `L{layer}H{head}`, both counted from 0 as the tensors index them (`L17H3` is
`attentions[17, 3]`). The same string labels the UI, CSV columns and rows, exports and links.
"""
from __future__ import annotations

import re

_HEAD = re.compile(r"^\s*L(\d+)\s*H(\d+)\s*$", re.IGNORECASE)


def head_name(layer: int, head: int) -> str:
    return f"L{int(layer)}H{int(head)}"


def parse_head_name(name: str) -> tuple[int, int]:
    """`"L17H3"` -> (17, 3); anything else is a ValueError that shows the expected form."""
    m = _HEAD.match(str(name))
    if not m:
        raise ValueError(f"{name!r} is not a head name; write it like L0H3 (layer 0, head 3)")
    return int(m.group(1)), int(m.group(2))


def head_names(n_layers: int, n_heads: int) -> list[str]:
    """Every head, layer by layer: the order of a flattened [L, H] tensor."""
    return [head_name(i, h) for i in range(n_layers) for h in range(n_heads)]


def session_key(page: str, name: str) -> str:
    """Session-state and widget keys: `<page>.<name>`, so pages never collide (`heads.mask`)."""
    return f"{page}.{name}"
