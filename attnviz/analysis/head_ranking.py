"""Finding heads that link two words: every head ranked by how much MORE the chosen query attends
to the chosen key than the other queries do.

A head that sends every row to one token (a noun every word looks at, a sink) gives the chosen
query a large weight on it too; ranked by that weight alone it would be taken for a head that
links the pronoun to its noun. Its contrast (the query's weight minus the other queries' mean
weight on the same key) is near zero, so it ranks low and is labelled a column head instead.

A query or a key may be a span of tokens (a word split over several tokens: 花 · 瓶, or byte
pieces): the key's weight is the mass the query rows put on all its tokens, averaged over the
query's tokens.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from attnviz.analysis.stats import as_attention, check_index, is_causal

RANK_COLUMNS = ("rank", "layer", "head", "weight", "others", "contrast", "key_rank", "pattern")
# A head is a column head for the pair when the other queries give the key at least this share of
# what the chosen query gives it: the key draws everyone, not this query in particular.
COLUMN_SHARE = 0.5
# Below this weight a head does not send the query to the key at all.
WEAK_WEIGHT = 0.1
PATTERNS = {
    "link": "the query looks at the key far more than the other words do",
    "column": "every word looks at the key about as much: a column head, not a link",
    "sink": "every word parks its weight on this start or special token",
    "weak": f"the query gives the key under {WEAK_WEIGHT:g} of its weight",
}


def _span(span: int | Sequence[int], n: int) -> list[int]:
    positions = [span] if isinstance(span, (int, np.integer)) else list(span)
    if not positions:
        raise ValueError("a query or key span needs at least one token")
    return sorted({check_index(int(p), n) for p in positions})


def rank_heads(attn: torch.Tensor, query: int | Sequence[int], key: int | Sequence[int],
               causal: bool | None = None, content: Sequence[int] | None = None,
               by: str = "contrast") -> pd.DataFrame:
    """Every head ranked for the pair query → key ("which heads send *it* to *animal*?").

    ``query`` and ``key`` are token positions or spans of them. One row per (layer, head):
    ``weight`` the mass the query's rows put on the key's tokens (averaged over the query's
    tokens); ``others`` the same mass averaged over the other queries that can see the whole key
    (``content`` positions only when given, so special tokens are not counted; the key's own
    tokens never), NaN when there is none; ``contrast`` = weight − others (= weight with no other
    query); ``key_rank`` 1 when the key holds more of the query's weight than any single token
    outside it; ``pattern`` one of PATTERNS. Sorted ``by`` "contrast" (default) or "weight",
    strongest first, ties to the lower layer then head. A decoder's query cannot see a later key,
    so a key after the query is refused when ``causal`` (guessed from the upper triangle when None).
    """
    if by not in ("contrast", "weight"):
        raise ValueError(f"rank by 'contrast' or 'weight', not {by!r}")
    attn = as_attention(attn)
    n_layers, n_heads, n, _ = attn.shape
    queries, keys = _span(query, n), _span(key, n)
    causal = is_causal(attn) if causal is None else causal
    if causal and keys[-1] > queries[0]:
        raise ValueError(f"in a decoder token {queries[0]} cannot attend to the later token {keys[-1]}; "
                         f"pick a key at or before the query (0..{queries[0]})")
    weight = attn[:, :, queries][..., keys].sum(-1).mean(-1).double()            # (L, H)
    pool = range(n) if content is None else sorted({check_index(int(p), n) for p in content})
    others_at = [p for p in pool if p not in queries and p not in keys and not (causal and p < keys[-1])]
    others = (attn[:, :, others_at][..., keys].sum(-1).mean(-1).double() if others_at
              else torch.full_like(weight, float("nan")))
    contrast = weight - torch.nan_to_num(others, nan=0.0)
    outside = torch.ones(n, dtype=torch.bool)
    outside[keys] = False
    mean_rows = attn[:, :, queries].mean(2)                                       # (L, H, n)
    key_rank = (mean_rows[..., outside] > weight[..., None].float()).sum(-1) + 1
    sink_key = 0 in keys or (content is not None and any(k not in pool for k in keys))
    shared = torch.nan_to_num(others, nan=0.0) >= COLUMN_SHARE * weight
    pattern = np.where(weight.numpy() < WEAK_WEIGHT, "weak",
                       np.where(shared.numpy(), "sink" if sink_key else "column", "link"))
    layers, heads = torch.meshgrid(torch.arange(n_layers), torch.arange(n_heads), indexing="ij")
    table = pd.DataFrame({"layer": layers.flatten().numpy(), "head": heads.flatten().numpy(),
                          "weight": weight.flatten().numpy(), "others": others.flatten().numpy(),
                          "contrast": contrast.flatten().numpy(),
                          "key_rank": key_rank.flatten().numpy(), "pattern": pattern.flatten()})
    table = table.sort_values([by, "layer", "head"], ascending=[False, True, True],
                              kind="stable").reset_index(drop=True)
    table.insert(0, "rank", np.arange(1, len(table) + 1))
    return table[list(RANK_COLUMNS)]


def ranking_sentences(ranking: pd.DataFrame, query: str, key: str) -> list[str]:
    """The answer in words, from a `rank_heads` table and the pair's labels: the head that links
    the pair best, and, when the head that gives the key the most weight is a column head, why it
    is not the answer."""
    if ranking.empty:
        return []
    top = ranking.iloc[0]
    name = f"Layer {int(top['layer'])}, head {int(top['head'])}"
    if np.isnan(top["others"]):
        first = (f"{name} sends {top['weight']:.2f} of “{query}”'s attention to “{key}” (there is no "
                 "other word to compare it with, so no contrast to measure).")
    elif top["pattern"] == "link":
        first = (f"{name} links “{query}” to “{key}”: it sends {top['weight']:.2f} of “{query}”'s "
                 f"attention there, against {top['others']:.2f} from the other words on average "
                 f"(contrast {top['contrast']:+.2f}).")
    else:
        first = (f"No head links “{query}” to “{key}” more than it links the other words: the best, "
                 f"{name}, sends {top['weight']:.2f} there against {top['others']:.2f} from the "
                 f"others (contrast {top['contrast']:+.2f}; {PATTERNS[top['pattern']]}).")
    out = [first]
    strongest = ranking.loc[ranking["weight"].idxmax()]
    if (int(strongest["layer"]), int(strongest["head"])) != (int(top["layer"]), int(top["head"])) \
            and strongest["pattern"] in ("column", "sink"):
        out.append(f"Layer {int(strongest['layer'])}, head {int(strongest['head'])} gives “{key}” more "
                   f"({strongest['weight']:.2f}), but the other words give it {strongest['others']:.2f} "
                   f"too: {PATTERNS[strongest['pattern']]}, so it ranks number {int(strongest['rank'])} here.")
    return out
