"""What one image against several captions says (`core.dual.Match`), as arrays and tables for the
views: each caption's score, which patches the image's pooled token reads, which words each
caption's pooled token reads."""
from __future__ import annotations

import pandas as pd
import torch

from attnviz.analysis import stats
from attnviz.core.dual import Match

MAX_CAPTIONS = 8        # each caption is one text-tower pass; eight keep a rerun quick on a CPU
MAX_CAPTION_CHARS = 300


def captions_from(text: str) -> list[str]:
    """One caption per line (blank lines skipped) -> the list to score; ValueError saying what to fix."""
    captions = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not captions:
        raise ValueError("type at least one caption, one per line")
    if len(captions) > MAX_CAPTIONS:
        raise ValueError(f"{len(captions)} captions; at most {MAX_CAPTIONS}, one per line")
    long = next((c for c in captions if len(c) > MAX_CAPTION_CHARS), None)
    if long is not None:
        raise ValueError(f"a caption has {len(long)} characters; keep each under {MAX_CAPTION_CHARS}")
    return captions


def caption_table(match: Match) -> pd.DataFrame:
    """One row per caption: its score (the model's logit) and probability, best first."""
    kind = "P(match), softmax over the captions" if match.score == "softmax" else "P(match), sigmoid of each"
    table = pd.DataFrame({"caption": match.captions, "score": match.logits.float().numpy(),
                          kind: match.probs.float().numpy()})
    return table.sort_values("score", ascending=False, kind="stable").reset_index(drop=True)


def image_read_maps(match: Match) -> torch.Tensor:
    """[L', H, gh, gw] what the image's pooled token reads of each patch: CLS's row in every layer,
    or the pooling probe's weights (L' = 1)."""
    tr = match.image
    return stats.to_patch_grid(match.image_reads, 0 if match.probe else tr.n_prefix, tr.grid)


def text_reads(match: Match, i: int) -> tuple[list[str], torch.Tensor]:
    """(caption i's tokens, [L, n] the weight its pooled token puts on each, mean over heads)."""
    if not 0 <= i < len(match.texts):
        raise ValueError(f"caption {i} is outside 0..{len(match.texts) - 1}")
    return match.texts[i].tokens, match.text_reads[i].float().mean(1)


def cross_mask(off: list[str], n_layers: int, n_heads: int) -> torch.Tensor:
    """Head names "L{layer}.H{head}" switched off -> a float [n_layers, n_heads] mask (1 keeps)."""
    mask = torch.ones(n_layers, n_heads)
    for name in off:
        layer, _, head = str(name).removeprefix("L").partition(".H")
        if not (layer.isdigit() and head.isdigit() and int(layer) < n_layers and int(head) < n_heads):
            raise ValueError(f"{name!r} is not a head of this text encoder (L0.H0 .. L{n_layers - 1}.H{n_heads - 1})")
        mask[int(layer), int(head)] = 0.0
    return mask
