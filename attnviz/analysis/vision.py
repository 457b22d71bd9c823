"""What vision heads look at: patch maps, rollout, artefact tokens, distances, head-mask effects.

Everything takes a `Trace` of a vision model (``trace.grid`` set) and returns tensors over the
patch grid, so a map's element [r, c] belongs to the patch in row r, column c of the model input.
`Model.pixels` squeezes the whole photo to the input square, so patch (r, c) also covers the
fraction [r/gh, (r+1)/gh) x [c/gw, (c+1)/gw) of the original photo: `render.overlay_patch_map` draws
maps over the photo at any size with exactly that mapping, and `attnviz.figures.image_figures` draws the
overlay grids and outlined patches (`patch_box` here is the pixel box both use).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from attnviz.analysis import stats
from attnviz.core.model import Model, Trace
from attnviz.uploads.images import check_aspect
from attnviz.base.limits import LIMITS

# Artefact tokens (Darcet et al. 2024, "Vision Transformers Need Registers"): DINOv2 recycles a
# few low-information background patches as global scratch space; their residual-stream norm is
# far above every other patch's. A patch is flagged when its norm exceeds median + k * MAD over the
# patches (MAD = median absolute deviation, not rescaled). k = 6 is about 4 robust standard
# deviations (1 sigma = 1.4826 MAD): a Gaussian spread flags ~1 patch in 40,000. On four of the
# five sample photos the bundled ViT-S/14's strongest outliers reach 7.5-13 MAD at the last
# block's input (the rocket has none above 4); large DINOv2 models show far stronger ones.
ARTEFACT_K = 6.0


# --- Input checks ------------------------------------------------------------------------------
def check_photo(image: Image.Image, patch_size: int, max_aspect: float | None = None) -> None:
    """Refuse a photo no vision model can say anything about, with a message saying why.

    A photo smaller than one patch of the model on a side (a 1 x 1 GIF) would only be blown up
    into a blur, and a strip beyond `max_aspect`:1 (1 x 640 px) squeezes to nothing. Raises
    ValueError; `uploads.images.open_image` already refuses the strips of uploads from their header."""
    max_aspect = LIMITS.max_image_aspect if max_aspect is None else max_aspect
    width, height = image.size
    check_aspect(width, height, max_aspect)
    if min(width, height) < patch_size:
        raise ValueError(
            f"The image is {width}×{height} px, smaller than one {patch_size}×{patch_size}-px "
            f"patch of this model: upload a photo at least {patch_size} px on each side "
            f"(better {LIMITS.min_image_side} px or more)."
        )


# --- Input size ------------------------------------------------------------------------------
def resolution_options(patch_size: int, low: int | None = None, high: int | None = None) -> list[int]:
    """Input sides (pixels) that are multiples of the patch size within [low, high]
    (default: LIMITS.min_image_side .. max_image_side)."""
    low = LIMITS.min_image_side if low is None else low
    high = LIMITS.max_image_side if high is None else high
    if patch_size < 1:
        raise ValueError(f"patch size must be at least 1, got {patch_size}")
    first = -(-low // patch_size) * patch_size
    sizes = list(range(first, high + 1, patch_size))
    if not sizes:
        raise ValueError(f"no multiple of the patch size {patch_size} lies in {low}..{high} px")
    return sizes


def attention_bytes(side: int, model: Model) -> int:
    """Memory of one trace's attention weights at a side x side input: L x H x n^2 float32 (DINOv2
    ViT-S at 448 px: 302 MB; ViT-B/8 would need 5.7 GB, so sides past LIMITS.image_attention_mb
    are not offered)."""
    c = model.cfg
    return c.n_layers * c.n_heads * token_count(side, c.patch_size, c.n_prefix) ** 2 * 4


def model_resolutions(model: Model, budget: int | None = None) -> list[int]:
    """The sides offered for this model: multiples of its patch size in 112..448 px whose
    attention weights fit `budget` (LIMITS.image_attention_mb; always at least the smallest)."""
    budget = LIMITS.image_attention_mb * 2**20 if budget is None else budget
    options = resolution_options(model.cfg.patch_size)
    fitting = [side for side in options if attention_bytes(side, model) <= budget]
    return fitting or options[:1]


def default_resolution(model: Model) -> int:
    """The model's own input size when it is offered, else the nearest offered side."""
    return min(model_resolutions(model), key=lambda side: abs(side - model.image_size))


def token_count(side: int, patch_size: int, n_prefix: int = 1) -> int:
    """Tokens of a side x side input: (side / p)^2 patches plus CLS and registers."""
    return (side // patch_size) ** 2 + n_prefix


# --- Patch maps --------------------------------------------------------------------------------
def _attentions(trace: Trace) -> torch.Tensor:
    if trace.grid is None:
        raise ValueError("this trace is not from a vision model (it has no patch grid)")
    if trace.attentions is None:
        raise ValueError("the trace holds no attention weights: trace with attentions=True")
    return trace.attentions


def cls_maps(trace: Trace) -> torch.Tensor:
    """Attention from CLS to every patch, per captured layer and head: [L, H, gh, gw].

    CLS and registers are dropped as keys, so a map shows how CLS spreads over the image only
    (its rows then sum to 1 minus what CLS put on prefix tokens). A model without a CLS token
    (SigLIP's vision tower, whose pooling head reads the patches instead): the mean over every
    patch's row, what the patches read on average."""
    attn = _attentions(trace)                                   # (L, H, n, n)
    return stats.to_patch_grid(attn[:, :, 0, :] if trace.n_prefix else attn.mean(2), trace.n_prefix, trace.grid)


def patch_token(trace: Trace, row: int, col: int) -> int:
    """Token index of the patch in row `row`, column `col` (row-major after the prefix)."""
    grid_h, grid_w = trace.grid
    if not (0 <= row < grid_h and 0 <= col < grid_w):
        raise ValueError(f"patch ({row}, {col}) is outside the {grid_h} x {grid_w} grid: "
                         f"rows 0..{grid_h - 1}, columns 0..{grid_w - 1}")
    return trace.n_prefix + row * grid_w + col


def patch_query_maps(trace: Trace, row: int, col: int) -> torch.Tensor:
    """Where the patch (row, col) attends, per captured layer and head: [L, H, gh, gw]."""
    attn = _attentions(trace)
    query = patch_token(trace, row, col)
    return stats.to_patch_grid(attn[:, :, query, :], trace.n_prefix, trace.grid)


def discount_tokens(attn: torch.Tensor, drop) -> torch.Tensor:
    """Attention [..., n, n] with the keys `drop` ([n] bool, e.g. artefact patches: attention
    sinks) taken out and every row renormalised over the rest (a row left with nothing stays 0)."""
    drop = torch.as_tensor(drop, dtype=torch.bool)
    kept = attn.masked_fill(drop, 0.0)
    return kept / kept.sum(-1, keepdim=True).clamp_min(1e-12)


def artefact_tokens(trace: Trace, artefacts: "Artefacts") -> torch.Tensor:
    """[n] bool: the tokens of the flagged artefact patches."""
    out = torch.zeros(trace.n, dtype=torch.bool)
    out[trace.n_prefix:] = artefacts.flags.flatten()
    return out


def rollout_map(trace: Trace, head_mask=None, residual: bool = True, discount=None) -> torch.Tensor:
    """CLS row of attention rollout over every captured layer, on the patch grid: [gh, gw].

    With `head_mask` ([L, H], 0 = off) switched-off heads are left out of each layer's average,
    which is what the masked model's information flow looks like. `discount` ([n] bool, e.g.
    `artefact_tokens`): those keys are taken out of every layer first (`discount_tokens`), so one
    artefact patch that collects most of the weight no longer makes the rest look empty."""
    attn = _attentions(trace)
    if discount is not None:
        attn = discount_tokens(attn, discount)
    flow = stats.rollout(attn, residual=residual, head_mask=head_mask)      # (n, n)
    return stats.to_patch_grid(flow[0] if trace.n_prefix else flow.mean(0), trace.n_prefix, trace.grid)


def attention_distance_px(trace: Trace, patch_size: int) -> torch.Tensor:
    """Mean attention distance per captured layer and head in input pixels: [L, H].

    As in the ViT paper: Euclidean distance between patch centres, weighted by attention, averaged
    over query patches. CLS and registers are left out as queries and keys (their weight is
    renormalised away), so a head that parks mass on CLS is not mistaken for a local one."""
    attn = _attentions(trace)
    grid_h, grid_w = trace.grid
    coords, is_patch = stats.patch_grid_coords(grid_h, grid_w, trace.n_prefix)
    return stats.mean_attention_distance(attn, coords * patch_size, is_patch, causal=False)


def patch_box(row: int, col: int, grid: tuple[int, int], size: tuple[int, int]
              ) -> tuple[int, int, int, int]:
    """Pixel box (left, top, right, bottom), inclusive, of patch (row, col) in an image of
    `size` = (width, height): the same pixels `overlay_patch_map` colours for that patch.

    In an image with fewer pixels than patches on a side some patches own no pixel; their box
    is the one pixel row or column where the patch would lie, so a box is never empty."""
    grid_h, grid_w = grid
    width, height = size
    top, bottom = -(-row * height // grid_h), -(-(row + 1) * height // grid_h) - 1
    left, right = -(-col * width // grid_w), -(-(col + 1) * width // grid_w) - 1
    top, left = min(top, height - 1), min(left, width - 1)
    return left, top, max(left, right), max(top, bottom)


# --- High-norm artefact tokens -----------------------------------------------------------------
@dataclass(frozen=True)
class Artefacts:
    layer: int              # residual stream read: input of block `layer`; n_layers = final output
    norms: torch.Tensor     # [gh, gw] L2 norm of each patch's hidden state there
    flags: torch.Tensor     # [gh, gw] bool, norm > threshold
    median: float
    mad: float
    threshold: float        # median + k * mad
    k: float

    @property
    def patches(self) -> list[tuple[int, int]]:
        """Flagged (row, col), highest norm first."""
        rows, cols = self.flags.nonzero(as_tuple=True)
        found = [(int(r), int(c)) for r, c in zip(rows, cols)]
        return sorted(found, key=lambda rc: -float(self.norms[rc]))

    @property
    def robust_z(self) -> torch.Tensor:
        """(norm - median) / MAD per patch: how many MADs above the typical patch."""
        return (self.norms - self.median) / max(self.mad, 1e-12)


def flag_high_norm(norms, k: float = ARTEFACT_K) -> tuple[torch.Tensor, float, float, float]:
    """(flags, median, MAD, threshold) for values far above the rest: value > median + k * MAD.

    The median and MAD ignore a handful of outliers, unlike mean and standard deviation, which
    a few huge artefact norms would inflate until they hide themselves. When more than half the
    values are equal the MAD is 0 and everything above that common value is flagged."""
    values = torch.as_tensor(norms, dtype=torch.float32).flatten()
    if values.numel() == 0:
        raise ValueError("no norms to check")
    if not k > 0:
        raise ValueError(f"k must be positive (how many MADs above the median), got {k}")
    # torch.median picks the lower middle value; numpy's definition (mean of the two) is the usual.
    median = float(np.median(values.numpy()))
    mad = float(np.median(np.abs(values.numpy() - median)))
    threshold = median + k * mad
    flags = torch.as_tensor(norms, dtype=torch.float32) > threshold
    return flags, median, mad, threshold


def find_artefacts(trace: Trace, layer: int | None = None, k: float = ARTEFACT_K) -> Artefacts:
    """Flag patch tokens whose hidden-state norm is far above the rest (see ARTEFACT_K).

    Reads ``trace.states`` (trace with states=True): ``layer`` i is the input of block i, and
    ``layer = n_layers`` the final (normalised) output. The default is the input of the last
    block, where DINOv2's outliers stand out most: the final layer norm flattens them."""
    if trace.states is None:
        raise ValueError("the trace holds no hidden states: trace with states=True")
    if trace.grid is None:
        raise ValueError("this trace is not from a vision model (it has no patch grid)")
    last = len(trace.states) - 1
    layer = last - 1 if layer is None else int(layer)
    if not 0 <= layer <= last:
        raise ValueError(f"layer must lie in 0..{last} ({last} = final output), got {layer}")
    norms = trace.states[layer].float().norm(dim=-1)                            # (n,)
    grid_norms = stats.to_patch_grid(norms, trace.n_prefix, trace.grid)      # (gh, gw)
    flags, median, mad, threshold = flag_high_norm(grid_norms, k)
    return Artefacts(layer, grid_norms, flags, median, mad, threshold, float(k))


# --- Effect of a head mask ---------------------------------------------------------------------
def saliency_iou(before, after, threshold: float = 0.5) -> float:
    """Intersection over union of the two maps thresholded at `threshold` (value >= threshold).

    Two empty masks agree perfectly: 1.0."""
    a = torch.as_tensor(before) >= threshold
    b = torch.as_tensor(after) >= threshold
    if a.shape != b.shape:
        raise ValueError(f"saliency maps differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    union = int((a | b).sum())
    return 1.0 if union == 0 else int((a & b).sum()) / union


@dataclass(frozen=True)
class MaskEffect:
    heads_off: int
    cls_cosine: float                     # cosine of the final CLS embeddings, before vs after
    saliency_iou: float | None            # None when the model has no saliency decoder
    saliency_mean_abs_change: float | None


def mask_effect(before: Trace, after: Trace, head_mask=None, threshold: float = 0.5) -> MaskEffect:
    """How much switching heads off changed the model's outputs (before = full model)."""
    if before.hidden.shape != after.hidden.shape:
        raise ValueError("the two traces have different token counts: trace the same image "
                         "at the same resolution")
    cosine = float(torch.nn.functional.cosine_similarity(
        before.hidden[0].double(), after.hidden[0].double(), dim=0))
    off = 0 if head_mask is None else int((torch.as_tensor(head_mask) == 0).sum())
    if before.saliency is None or after.saliency is None:
        return MaskEffect(off, cosine, None, None)
    change = float((after.saliency - before.saliency).abs().mean())
    return MaskEffect(off, cosine, saliency_iou(before.saliency, after.saliency, threshold), change)


# --- Export ------------------------------------------------------------------------------------
def maps_npz(trace: Trace, patch_size: int, *, head_mask=None, query: tuple[int, int] | None = None,
             artefacts: Artefacts | None = None) -> bytes:
    """The page's maps as one compressed NPZ (plain arrays; np.load works with allow_pickle=False).

    Holds cls_maps [L, H, gh, gw], rollout [gh, gw], mean_distance_px [L, H], layers, grid,
    n_prefix, patch_size, image_size; and when available saliency [H, W], head_mask [L, H],
    query_maps [L, H, gh, gw] with query (row, col), artefact norms/flags with their layer and k."""
    grid_h, grid_w = trace.grid
    arrays = {
        "cls_maps": cls_maps(trace).numpy(),
        "rollout": rollout_map(trace, head_mask).numpy(),
        "mean_distance_px": attention_distance_px(trace, patch_size).numpy(),
        "layers": np.asarray(trace.layers, dtype=np.int64),
        "grid": np.asarray([grid_h, grid_w], dtype=np.int64),
        "n_prefix": np.asarray(trace.n_prefix, dtype=np.int64),
        "patch_size": np.asarray(patch_size, dtype=np.int64),
        "image_size": np.asarray([grid_h * patch_size, grid_w * patch_size], dtype=np.int64),
    }
    if trace.saliency is not None:
        arrays["saliency"] = trace.saliency.numpy()
    if head_mask is not None:
        arrays["head_mask"] = torch.as_tensor(head_mask, dtype=torch.float32).numpy()
    if query is not None:
        arrays["query"] = np.asarray(query, dtype=np.int64)
        arrays["query_maps"] = patch_query_maps(trace, *query).numpy()
    if artefacts is not None:
        arrays["artefact_norms"] = artefacts.norms.numpy()
        arrays["artefact_flags"] = artefacts.flags.numpy()
        arrays["artefact_layer"] = np.asarray(artefacts.layer, dtype=np.int64)
        arrays["artefact_k"] = np.asarray(artefacts.k, dtype=np.float64)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()
