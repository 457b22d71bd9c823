"""Head statistics, roles and attention rollout, computed from captured attention alone.

Contract (the public `Trace.attentions`): ``attn`` is a float tensor ``[L, H, n, n]`` of
post-softmax weights whose rows sum to 1 (queries are rows, keys are columns); decoders are
causal, so their upper triangle is 0. Nothing here needs the model, so every function works on any trace, cached or imported.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

# --- Role thresholds -------------------------------------------------------------------------
# A head earns a positional role (previous-token, self, sink) when, on average over queries, the
# majority of its weight goes to that one key: at 0.5 no other single key can hold more.
ROLE_MIN_SHARE = 0.5
# "Collapsed": every query puts at least this much on a single key. 0.9 rather than 1.0 because
# real heads always leak a little mass; checked on the worst row, so one diffuse query breaks it.
COLLAPSED_MIN_ROW_MAX = 0.9
# "Uniform": entropy within 5 % of the maximum log(#visible keys), i.e. indistinguishable from
# averaging. "Broad" (the role) is looser: 0.8 still spreads over most of the visible keys.
UNIFORM_MIN_NORM_ENTROPY = 0.95
BROAD_MIN_NORM_ENTROPY = 0.8
# "Local": mean |i-j| at most 3 tokens (a small window) AND at most half of what a uniform head
# would give on the same input; the second condition stops every head on a 5-token input being
# called local.
LOCAL_MAX_DISTANCE = 3.0
LOCAL_MAX_DISTANCE_RATIO = 0.5
# "Long-range": attends clearly farther than a uniform head would (which is ~n/3 for encoders,
# ~n/4 for decoders); the largest possible ratio is ~2-2.25, so 1.25 is "clearly".
LONG_RANGE_MIN_DISTANCE_RATIO = 1.25
# Upper-triangle mass below this counts as zero when guessing whether a trace is causal.
CAUSAL_TOLERANCE = 1e-6

ROLES = ("previous-token", "self", "sink", "local", "broad", "long-range", "mixed")

STAT_COLUMNS = (
    "layer", "head", "entropy", "norm_entropy", "mean_distance", "first_share", "special_share",
    "prev_share", "self_share", "max_weight", "role", "collapsed", "uniform", "artefact_share",
)


# --- Validation ------------------------------------------------------------------------------
def as_attention(attn) -> torch.Tensor:
    """Check the [L, H, n, n] contract and return a float32 tensor."""
    if not isinstance(attn, torch.Tensor):
        attn = torch.as_tensor(np.asarray(attn))
    if attn.ndim != 4 or attn.shape[-1] != attn.shape[-2] or attn.shape[-1] == 0:
        raise ValueError(
            "attention must have shape [layers, heads, n, n] with n >= 1, "
            f"got {tuple(attn.shape)}; "
            "pass Trace.attentions, or attn[None, None] for a single n x n matrix"
        )
    return attn.float()


def _as_special(special, n: int) -> torch.Tensor | None:
    if special is None:
        return None
    special = torch.as_tensor(special, dtype=torch.bool)
    if special.shape != (n,):
        raise ValueError(f"special must be a bool tensor of shape [{n}] (one flag per token), "
                         f"got {tuple(special.shape)}")
    return special


def is_causal(attn: torch.Tensor) -> bool:
    """True when no query attends to a later key in any layer or head (a decoder's trace)."""
    attn = as_attention(attn)
    if attn.shape[-1] == 1:
        return False
    # Layer by layer so an encoder (mass above the diagonal in layer 0) is decided at once.
    return all(bool(layer.triu(diagonal=1).abs().max() <= CAUSAL_TOLERANCE) for layer in attn)


def visible_keys(n: int, causal: bool) -> torch.Tensor:
    """Number of keys each query row may attend to: [n] (i + 1 for causal rows, else n)."""
    return torch.arange(1, n + 1) if causal else torch.full((n,), n)


def _position_distances(n: int) -> torch.Tensor:
    pos = torch.arange(n, dtype=torch.float32)
    return (pos[:, None] - pos[None, :]).abs()  # (n, n): |i - j|


def _masked_row_mean(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mean over the last axis (query rows) restricted to `rows`; over all rows when none
    qualifies (a one-token input, where every statistic is trivially determined)."""
    if not bool(rows.any()):
        return values.mean(-1)
    return values[..., rows].mean(-1)


# --- Head statistics and roles ---------------------------------------------------------------
def head_stats(attn: torch.Tensor, special: torch.Tensor | None = None,
               causal: bool | None = None, artefacts: torch.Tensor | None = None) -> pd.DataFrame:
    """One row per (layer, head) with entropy, distances, shares, a role and two flags.

    Means are over query rows that have a choice: in a causal trace row 0 can only see itself,
    so it says nothing about the head and is left out (an encoder's rows all count).
    ``special`` ([n] bool) marks [CLS]/[SEP]/<|im_start|>/image CLS and registers; without it
    ``special_share`` is NaN. ``causal`` is guessed from the upper triangle when None.
    ``artefacts`` ([n] bool, e.g. DINOv2's high-norm patches) gives ``artefact_share`` (else NaN):
    like the first token's share, an attention sink a head may dump its weight into.
    """
    attn = as_attention(attn)
    n_layers, n_heads, n, _ = attn.shape
    special = _as_special(special, n)
    artefacts = _as_special(artefacts, n)
    causal = is_causal(attn) if causal is None else causal
    n_visible = visible_keys(n, causal)
    has_choice = n_visible > 1                      # (n,) rows that say something about the head
    has_previous = has_choice & (torch.arange(n) >= 1)
    distances = _position_distances(n)
    uniform_distance = _uniform_distance(n, causal)

    records = []
    for layer in range(n_layers):
        A = attn[layer]                                            # (H, n, n)
        row_entropy = torch.special.entr(A).sum(-1)                # (H, n) nats
        row_norm_entropy = torch.zeros_like(row_entropy)
        row_norm_entropy[:, has_choice] = (row_entropy[:, has_choice]
                                           / n_visible[has_choice].double().log().float())
        row_distance = (A * distances).sum(-1)                     # (H, n)
        row_max = A.max(-1).values                                 # (H, n)
        # Row i's previous key is i-1: the sub-diagonal; pad row 0 (it has no previous token).
        row_prev = torch.cat([torch.zeros(n_heads, 1), A.diagonal(-1, -2, -1)], dim=-1)
        columns = {
            "entropy": _masked_row_mean(row_entropy, has_choice),
            "norm_entropy": _masked_row_mean(row_norm_entropy, has_choice),
            "mean_distance": _masked_row_mean(row_distance, has_choice),
            "first_share": _masked_row_mean(A[..., 0], has_choice),
            "special_share": (_masked_row_mean(A[..., special].sum(-1), has_choice)
                              if special is not None else torch.full((n_heads,), math.nan)),
            "prev_share": _masked_row_mean(row_prev, has_previous),
            "self_share": _masked_row_mean(A.diagonal(0, -2, -1), has_choice),
            "max_weight": _masked_row_mean(row_max, has_choice),
            "artefact_share": (_masked_row_mean(A[..., artefacts].sum(-1), has_choice)
                               if artefacts is not None else torch.full((n_heads,), math.nan)),
        }
        worst_row_max = row_max[:, has_choice].min(-1).values if has_choice.any() else row_max[:, 0]
        for head in range(n_heads):
            record = {"layer": layer, "head": head}
            record.update({k: float(v[head]) for k, v in columns.items()})
            record["role"] = _role(record, uniform_distance)
            record["collapsed"] = bool(worst_row_max[head] >= COLLAPSED_MIN_ROW_MAX)
            record["uniform"] = bool(has_choice.any()
                                     and record["norm_entropy"] >= UNIFORM_MIN_NORM_ENTROPY)
            records.append(record)
    return pd.DataFrame.from_records(records, columns=list(STAT_COLUMNS))


def _uniform_distance(n: int, causal: bool) -> float:
    """Mean |i-j| a perfectly uniform head would have on this input (the yardstick for roles)."""
    n_visible = visible_keys(n, causal)
    uniform = torch.ones(n, n) / n_visible[:, None]
    if causal:
        uniform = uniform.tril()
    row_distance = (uniform * _position_distances(n)).sum(-1)
    return float(_masked_row_mean(row_distance, n_visible > 1))


def _role(stats: dict, uniform_distance: float) -> str:
    """Pick one role; the positional roles win when a single key holds the majority."""
    sink_share = max(stats["first_share"], np.nan_to_num(stats["special_share"]),
                     np.nan_to_num(stats.get("artefact_share", math.nan)))
    positional = {"previous-token": stats["prev_share"], "self": stats["self_share"],
                  "sink": sink_share}
    best = max(positional, key=positional.get)
    if positional[best] >= ROLE_MIN_SHARE:
        return best
    if stats["norm_entropy"] >= BROAD_MIN_NORM_ENTROPY:
        return "broad"
    distance = stats["mean_distance"]
    if (distance <= LOCAL_MAX_DISTANCE
            and distance <= LOCAL_MAX_DISTANCE_RATIO * uniform_distance):
        return "local"
    if uniform_distance > 0 and distance >= LONG_RANGE_MIN_DISTANCE_RATIO * uniform_distance:
        return "long-range"
    return "mixed"


# --- Rollout ---------------------------------------------------------------------------------
def average_heads(attn: torch.Tensor, head_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Head-averaged attention [L, n, n]; with ``head_mask`` ([L, H], nonzero = kept) only kept
    heads are averaged. A layer with every head removed becomes the identity (only the residual
    stream carries information through it)."""
    attn = as_attention(attn)
    n_layers, n_heads, n, _ = attn.shape
    if head_mask is None:
        return attn.mean(1)
    keep = torch.as_tensor(head_mask).to(torch.float32)
    if keep.shape != (n_layers, n_heads):
        raise ValueError(f"head_mask must have shape [{n_layers}, {n_heads}] (layers, heads), "
                         f"got {tuple(keep.shape)}")
    keep = (keep != 0).float()
    kept_per_layer = keep.sum(1)                                       # (L,)
    summed = torch.einsum("lhij,lh->lij", attn, keep)                  # (L, n, n)
    averaged = summed / kept_per_layer.clamp(min=1)[:, None, None]
    empty = kept_per_layer == 0
    averaged[empty] = torch.eye(n)
    return averaged


def rollout_per_layer(attn: torch.Tensor, residual: bool = True,
                      head_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Cumulative attention rollout (Abnar & Zuidema 2020) after every layer: [L, n, n].

    Entry [l, i, j] estimates how much token i's representation after layer l draws on input
    token j: per layer, heads are averaged, the residual connection is modelled as 0.5 A + 0.5 I
    and rows are renormalised; the layers are then multiplied from the bottom up.
    """
    # float32 is enough: products of row-stochastic matrices stay in [0, 1] and rows are
    # renormalised every layer (float64 was ~3x slower at n = 512, 30 layers, for ~1e-7).
    per_layer = average_heads(attn, head_mask)
    n = per_layer.shape[-1]
    if residual:
        per_layer = 0.5 * per_layer + 0.5 * torch.eye(n)
    per_layer = per_layer / per_layer.sum(-1, keepdim=True).clamp(min=1e-12)
    cumulative = torch.empty_like(per_layer)
    joint = torch.eye(n)
    for layer, matrix in enumerate(per_layer):
        joint = matrix @ joint
        cumulative[layer] = joint
    return cumulative


def rollout(attn: torch.Tensor, residual: bool = True,
            head_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention rollout through all layers: [n, n], rows sum to 1."""
    return rollout_per_layer(attn, residual=residual, head_mask=head_mask)[-1]


# --- Per-token views ---------------------------------------------------------------------------
def check_index(index: int, n: int) -> int:
    if not -n <= index < n:
        raise ValueError(f"token index {index} is out of range for {n} tokens (use 0..{n - 1}, "
                         "or a negative index from the end)")
    return index % n


def token_flow(attn: torch.Tensor, index: int) -> torch.Tensor:
    """Where query token ``index`` looks in every layer, head-averaged: [L, n]."""
    attn = as_attention(attn)
    return attn[:, :, check_index(index, attn.shape[-1]), :].mean(1)


def attention_received(attn: torch.Tensor, index: int | None = None) -> torch.Tensor:
    """Attention flowing into keys, head-averaged and averaged over queries: [L, n]; with
    ``index`` only the column of that key, per query: [L, n] (who looks at token ``index``)."""
    attn = as_attention(attn)
    if index is None:
        return attn.mean(dim=(1, 2))
    return attn[:, :, :, check_index(index, attn.shape[-1])].mean(1)


def to_patch_grid(values: torch.Tensor, n_prefix: int, grid_hw: tuple[int, int]) -> torch.Tensor:
    """Drop the ``n_prefix`` non-patch tokens (CLS, registers) from the last axis and fold the
    rest into the patch grid: [..., n] -> [..., gh, gw] (row-major patches, as ViTs order them)."""
    values = torch.as_tensor(values)
    grid_h, grid_w = grid_hw
    n_patches = values.shape[-1] - n_prefix
    if n_prefix < 0 or n_patches != grid_h * grid_w:
        raise ValueError(f"{values.shape[-1]} tokens minus {n_prefix} prefix tokens is "
                         f"{n_patches}, not a {grid_h} x {grid_w} patch grid; check n_prefix "
                         "(CLS + registers) and the grid size")
    return values[..., n_prefix:].reshape(*values.shape[:-1], grid_h, grid_w)


def patch_grid_coords(grid_h: int, grid_w: int, n_prefix: int = 1
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(coords [n, 2] as (row, col) in patch units, mask [n] True for patches) for a ViT input
    whose first ``n_prefix`` tokens (CLS, registers) have no position in the image."""
    rows, cols = torch.meshgrid(torch.arange(grid_h), torch.arange(grid_w), indexing="ij")
    patch_coords = torch.stack([rows.flatten(), cols.flatten()], dim=1).float()   # (gh*gw, 2)
    coords = torch.cat([torch.zeros(n_prefix, 2), patch_coords])
    mask = torch.cat([torch.zeros(n_prefix, dtype=torch.bool),
                      torch.ones(grid_h * grid_w, dtype=torch.bool)])
    return coords, mask


def mean_attention_distance(attn: torch.Tensor, coords: torch.Tensor | None = None,
                            mask: torch.Tensor | None = None,
                            causal: bool | None = None) -> torch.Tensor:
    """Attention-weighted distance between query and key positions, mean over queries: [L, H].

    Without ``coords`` the distance is |i - j| in tokens. With ``coords`` ([n, 2], e.g. patch
    row/col from ``patch_grid_coords``) it is Euclidean, as in the ViT paper's plot. ``mask``
    ([n] bool) keeps only those tokens as queries and keys; each row's weight over the kept keys
    is renormalised, so a head that parks mass on CLS or registers is not mistaken for a local
    one. Rows with no kept mass, or only one visible key (causal row 0), are left out.
    """
    attn = as_attention(attn)
    n = attn.shape[-1]
    causal = is_causal(attn) if causal is None else causal
    keep = (torch.ones(n, dtype=torch.bool) if mask is None
            else torch.as_tensor(mask, dtype=torch.bool))
    if keep.shape != (n,):
        raise ValueError(f"mask must be a bool tensor of shape [{n}], got {tuple(keep.shape)}")
    idx = keep.nonzero()[:, 0]                                        # kept token positions
    if coords is None:
        kept_positions = idx.float()
        sub_distances = (kept_positions[:, None] - kept_positions[None, :]).abs()   # (m, m)
    else:
        coords = torch.as_tensor(coords, dtype=torch.float32)
        if coords.shape != (n, 2):
            raise ValueError(f"coords must have shape [{n}, 2] (one (row, col) per token), "
                             f"got {tuple(coords.shape)}")
        sub_distances = torch.cdist(coords[idx], coords[idx],  # (m, m) Euclidean, exact
                                    compute_mode="donot_use_mm_for_euclid_dist")
    visible_kept = (torch.cumsum(keep.long(), 0)[idx] if causal
                    else torch.full((len(idx),), len(idx)))
    result = torch.zeros(attn.shape[:2])
    for layer in range(attn.shape[0]):
        weights = attn[layer][:, idx][:, :, idx]                      # (H, m, m)
        mass = weights.sum(-1)                                        # (H, m)
        row_distance = (weights * sub_distances).sum(-1) / mass.clamp(min=1e-12)
        rows = (mass > 1e-12) & (visible_kept > 1)                    # (H, m)
        counted = rows.sum(-1).clamp(min=1)
        result[layer] = (row_distance * rows).sum(-1) / counted
    return result


# --- Bounding large inputs ---------------------------------------------------------------------
def downsample_attention(attn: torch.Tensor, max_n: int) -> torch.Tensor:
    """Block-pool the last two axes ([..., n, n] -> [..., m, m], m <= max_n) so an overview of a
    long input stays bounded. Query rows in a block are averaged and key columns summed, so each
    pooled row is still a distribution (sums to 1). Returned unchanged when n <= max_n."""
    attn = torch.as_tensor(attn).float()
    if max_n < 1:
        raise ValueError(f"max_n must be at least 1, got {max_n}")
    if attn.ndim < 2 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"expected [..., n, n] attention, got {tuple(attn.shape)}")
    n = attn.shape[-1]
    if n <= max_n:
        return attn
    block = math.ceil(n / max_n)
    m = math.ceil(n / block)
    pad = m * block - n
    padded = torch.nn.functional.pad(attn, (0, pad, 0, pad))         # (..., m*b, m*b), zeros
    blocks = padded.reshape(*attn.shape[:-2], m, block, m, block)     # (..., m, b, m, b)
    row_counts = torch.full((m,), float(block))
    row_counts[-1] = block - pad                                      # the ragged last block
    pooled = blocks.sum(dim=(-3, -1)) / row_counts[:, None]           # (..., m, m)
    return pooled
