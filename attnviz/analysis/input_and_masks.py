"""Three steps every transformer takes that no other view draws, computed on the real models.

1. `patch_tokens`: an image becomes tokens. The photo goes through `Model.pixels` (the model's own
   centre crop, bicubic resize and normalisation), is cut into the P x P patch grid in raster order,
   and each patch goes through the patch embedding; position embeddings are added, [CLS] (and any
   register tokens) go in front. The patches shown are slices of that very input tensor.
2. `padding`: sentences of different lengths batched with the model's tokenizer (right-padded),
   run once as a batch through `Transformer.forward(attention_mask=...)`, the block runner's key
   padding mask, and once each alone: pad keys get exactly zero weight and the real rows agree.
3. `pattern_mask` / `pattern_cost` / `measure_patterns`: sparse attention patterns (local window,
   strided, block) as n x n masks with what they cost, and what a dense kernel with a mask costs.

Shapes: masks (n, n) bool, True where query i (row) may look at key j (column).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from attnviz.base.limits import LIMITS
from attnviz.base.timing import Timing, measure
from attnviz.core.attention import causal_mask, local_attention, local_mask, padding_mask

# ---------------------------------------------------------------- 1. image -> patches -> tokens


@dataclass(frozen=True)
class PatchTokens:
    pixels: torch.Tensor        # [3, S, S] the normalised tensor the model gets
    rgb: np.ndarray             # [S, S, 3] uint8: that tensor un-normalised, for drawing
    crop: tuple[int, int, int]  # (left, top, side) of the centre square in the original photo
    photo_size: tuple[int, int]  # original (width, height)
    patch_size: int
    grid: tuple[int, int]       # patches per side (rows, columns)
    tokens: list[str]           # the model's token labels: CLS, registers, p{r},{c}
    n_prefix: int               # tokens before the patches (CLS + registers)
    n_registers: int
    d_model: int
    pos_grid: int               # the position table's own grid (DINOv2: 37 for 518 px)
    embedding_diff: float       # max |conv patch embedding - (flattened patch i) W + b| over patches
    patch_norm: float           # mean |patch embedding| over patches
    position_norm: float        # mean |position embedding| added to each patch

    @property
    def n_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def patch(self, i: int) -> torch.Tensor:
        """Patch i (raster order) of the model input: [3, P, P], a slice of `pixels`."""
        r, c = divmod(int(i), self.grid[1])
        p = self.patch_size
        return self.pixels[:, r * p:(r + 1) * p, c * p:(c + 1) * p]

    def patch_rgb(self, i: int) -> np.ndarray:
        r, c = divmod(int(i), self.grid[1])
        p = self.patch_size
        return self.rgb[r * p:(r + 1) * p, c * p:(c + 1) * p]


def crop_box(width: int, height: int) -> tuple[int, int, int]:
    """(left, top, side) of the centre square `core.pixels.fit_square(..., "crop")` keeps."""
    side = min(width, height)
    return (width - side) // 2, (height - side) // 2, side


def patch_tokens(model, photo, size: int | None = None) -> PatchTokens:
    """The photo as the vision model's token sequence, from the tensor the model itself gets."""
    cfg = model.cfg
    if not cfg.is_vision:
        raise ValueError(f"{model.info.key} is not a vision model: the patch view needs one (dinov2)")
    inp = model.inputs(photo, size)                        # Model.trace's own preprocessing
    px = inp["pixel_values"][0]                                          # (3, S, S)
    p, (gh, gw), n_prefix = cfg.patch_size, inp["grid"], inp["n_prefix"]
    net = model.net
    with torch.inference_mode():
        conv = net.patch(px[None]).flatten(2).transpose(1, 2)[0]        # (gh*gw, d)
        embedded = net.embed_image(px[None])[0]                          # (n_tokens, d)
        # the same embedding as one matrix product: patch i flattened (c, y, x) times the kernel
        flat = px.reshape(3, gh, p, gw, p).permute(1, 3, 0, 2, 4).reshape(gh * gw, 3 * p * p)
        weight = net.patch.weight.reshape(cfg.d_model, -1)                # (d, 3 P P)
        as_matmul = flat @ weight.T + (net.patch.bias if net.patch.bias is not None else 0)
        position = embedded[n_prefix:] - conv                             # (gh*gw, d)
    mean = torch.tensor(model.image_mean).view(3, 1, 1)
    std = torch.tensor(model.image_std).view(3, 1, 1)
    rgb = ((px * std + mean).clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    w, h = photo.size
    return PatchTokens(pixels=px, rgb=np.ascontiguousarray(rgb), crop=crop_box(w, h), photo_size=(w, h),
                       patch_size=p, grid=(gh, gw), tokens=inp["tokens"], n_prefix=n_prefix,
                       n_registers=cfg.n_registers, d_model=cfg.d_model, pos_grid=cfg.grid,
                       embedding_diff=float((conv - as_matmul).abs().max()),
                       patch_norm=float(conv.norm(dim=-1).mean()),
                       position_norm=float(position.norm(dim=-1).mean()))


# ---------------------------------------------------------------- 2. the padding mask


@dataclass(frozen=True)
class Padding:
    texts: list[str]
    tokens: list[list[str]]     # per sentence, padded to `width` (pad tokens named by the tokenizer)
    lengths: list[int]          # real tokens per sentence
    attention_mask: torch.Tensor  # [B, W] 1 = real token, 0 = pad (the tokenizer's)
    allowed: torch.Tensor       # [B, W, W] what each query may see: key padding (and causal for an LM)
    batched: torch.Tensor       # [B, W, W] one head's weights in the padded batch
    alone: list[torch.Tensor]   # per sentence [n_b, n_b] the same head, the sentence run alone
    unmasked: torch.Tensor      # [B, W, W] the padded batch run WITHOUT the mask
    layer: int
    head: int
    causal: bool
    pad_token: str
    pad_weight: float           # max weight any real query of any head gives a pad key, masked (0)
    row_diff: float             # max |batched real rows - alone| over sentences, this head
    layer_diff: float           # the same over every head of the layer
    hidden_diff: float          # max |final hidden of real tokens, batched - alone|
    unmasked_pad_weight: float  # without the mask: max total weight a real query (any head) gives pads
    unmasked_row_diff: float    # without the mask: max |real rows - alone|
    blocked_by_padding: int     # (real query, pad key) pairs only the padding mask blocks

    @property
    def width(self) -> int:
        return self.attention_mask.shape[1]


def batch_texts(model, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's tokenizer batches the texts, right-padded: (ids [B, W], attention_mask [B, W]).
    Right padding keeps every real token at its own position (this model takes no position ids),
    so a sentence's real tokens see exactly what they see alone."""
    tok = model.tokenizer
    if len(texts) < 2 or any(not t or not t.strip() for t in texts):
        raise ValueError("type two sentences (neither empty) to batch them")
    if tok is None or not getattr(tok, "is_fast", False) or tok.pad_token_id is None:
        raise ValueError(f"{model.info.key}'s tokenizer cannot pad a batch: pick minilm or smollm2")
    for t in texts:
        model.encode_text(t)                               # the model's own checks and messages
    limit = min(model.max_tokens, LIMITS.lab_max_tokens)
    enc = tok(list(texts), padding=True, padding_side="right", truncation=True, max_length=limit,
              return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def padding(model, texts: list[str], layer: int = 0, head: int = 0) -> Padding:
    """One head of one layer, the texts batched with padding against each sentence alone."""
    cfg = model.cfg
    if not 0 <= layer < cfg.n_layers or not 0 <= head < cfg.n_heads:
        raise ValueError(f"layer must lie in 0..{cfg.n_layers - 1} and head in 0..{cfg.n_heads - 1}")
    ids, keep = batch_texts(model, texts)                                # (B, W) each
    lengths = [int(n) for n in keep.sum(1)]
    with torch.inference_mode():
        out = model.net(input_ids=ids, attention_mask=keep, need_weights=True, layers=[layer], logits=False)
        bare = model.net(input_ids=ids, need_weights=True, layers=[layer], logits=False)
        runs = [model.trace(ids[b, :n], layers=[layer]) for b, n in enumerate(lengths)]
    batched = out.attentions[layer]                                      # (B, H, W, W)
    unmasked = bare.attentions[layer]
    B, W = ids.shape
    allowed = padding_mask(keep)[:, 0].expand(B, W, W)                   # (B, W, W): key j real
    if cfg.causal:
        allowed = allowed & causal_mask(W)
    real_q = keep.bool()[:, :, None]                                     # (B, W, 1)
    pad_k = ~keep.bool()[:, None, :]                                     # (B, 1, W)
    # every head of the layer: (B, H, W, W) against (B, 1, W, W) / (B, 1, W) selections
    on_pad = (batched * (real_q & pad_k)[:, None]).amax()
    leaked = (unmasked * pad_k[:, None]).sum(-1).masked_fill(~keep.bool()[:, None], 0).amax()
    row_diff = layer_diff = hidden_diff = bare_diff = 0.0
    for b, (n, tr) in enumerate(zip(lengths, runs)):
        layer_diff = max(layer_diff, float((batched[b, :, :n, :n] - tr.attentions[0]).abs().max()))
        row_diff = max(row_diff, float((batched[b, head, :n, :n] - tr.attentions[0, head]).abs().max()))
        bare_diff = max(bare_diff, float((unmasked[b, :, :n, :n] - tr.attentions[0]).abs().max()))
        hidden_diff = max(hidden_diff, float((out.hidden[b, :n] - tr.hidden).abs().max()))
    only_padding = real_q & pad_k & (causal_mask(W) if cfg.causal else torch.ones(W, W, dtype=torch.bool))
    labels = [model.inputs(ids[b].tolist())["tokens"] for b in range(B)]
    return Padding(texts=list(texts), tokens=labels, lengths=lengths, attention_mask=keep, allowed=allowed,
                   batched=batched[:, head].clone(), alone=[tr.attentions[0, head].clone() for tr in runs],
                   unmasked=unmasked[:, head].clone(), layer=layer, head=head, causal=cfg.causal,
                   pad_token=str(model.tokenizer.pad_token), pad_weight=float(on_pad),
                   row_diff=row_diff, layer_diff=layer_diff, hidden_diff=hidden_diff,
                   unmasked_pad_weight=float(leaked), unmasked_row_diff=bare_diff,
                   blocked_by_padding=int(only_padding.sum()))


# ---------------------------------------------------------------- 3. sparse patterns

PATTERNS = ("full", "local", "strided", "block")
BYTES_PER_SCORE = 4     # float32 scores
REPEATS = 7             # timed runs per kernel: the median of 7 is steady on a shared 2-core machine
# Wall time, latency as a user sees it. On a shared machine it is noisy (other programs' load swung
# one kernel's median from 1 to 32 ms here); CPU time is no cure with several threads, since idle
# threads spinning for work count too. The page says what was measured, not what should be.
CLOCK = "wall"


def pattern_name(kind: str, width: int) -> str:
    """'full', 'local:64' (core.attention's name for the window variant), 'strided:8', 'block:32'."""
    return kind if kind == "full" else f"{kind}:{width}"


def pattern_mask(kind: str, n: int, width: int = 1, causal: bool = False) -> torch.Tensor:
    """(n, n) bool. local: |i - j| < w (core.attention.local_mask); strided: (i - j) divisible by s
    (every s-th key, the strided half of Child et al. 2019's Sparse Transformer, which pairs it
    with a local window of s in another head); block: i and j in the same block of b positions
    (block-diagonal). `causal` also keeps only j <= i."""
    if kind not in PATTERNS:
        raise ValueError(f"unknown pattern {kind!r}; choose one of {', '.join(PATTERNS)}")
    if n < 1 or (kind != "full" and width < 1):
        raise ValueError("n and the pattern's width must be at least 1")
    i = torch.arange(n)
    if kind == "local":
        return local_mask(n, width, causal)
    if kind == "full":
        mask = torch.ones(n, n, dtype=torch.bool)
    elif kind == "strided":
        mask = (i[:, None] - i[None, :]) % width == 0
    else:
        mask = (i[:, None] // width) == (i[None, :] // width)
    return mask & causal_mask(n) if causal else mask


@dataclass(frozen=True)
class Cost:
    name: str
    scores: int             # query-key scores a kernel that skips the masked ones computes
    fraction: float         # scores / n^2
    score_bytes: int        # memory for those scores (float32, one head)
    flops_qk: int           # 2 * scores * d_head (multiply-adds of Q K^T)
    flops_av: int           # 2 * scores * d_head (the weighted sum A V)
    dense_scores: int       # what a dense kernel with this mask computes: always n^2
    dense_bytes: int        # its scores plus the bool mask


def pattern_cost(name: str, mask: torch.Tensor, d_head: int) -> Cost:
    n = mask.shape[-1]
    count = int(mask.sum())
    return Cost(name=name, scores=count, fraction=count / (n * n), score_bytes=BYTES_PER_SCORE * count,
                flops_qk=2 * count * d_head, flops_av=2 * count * d_head, dense_scores=n * n,
                dense_bytes=(BYTES_PER_SCORE + 1) * n * n)


def sliced_attention(kind: str, q, k, v, width: int, causal: bool):
    """The pattern computed by a kernel that skips what it masks: local by query blocks
    (core.attention.local_attention), block per block, strided per phase (positions r, r + s, ...
    attend only among themselves: a block pattern after sorting by phase); when the width divides
    n, blocks and phases are one batched call. (B, h, n, d) in and out."""
    n = q.shape[-2]
    if kind == "full":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if kind == "local":
        return local_attention(q, k, v, width, causal=causal)
    B, h, _, d = q.shape
    if n % width == 0:     # one batched call: every block (or phase) is a batch entry of its own
        if kind == "block":
            # (B, h, n, d) -> (B, h, n/b, b, d): block i holds positions i*b .. i*b + b - 1
            q, k, v = (x.reshape(B, h, n // width, width, d) for x in (q, k, v))
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal).reshape(B, h, n, d)
        # (B, h, n, d) -> (B, h, s, n/s, d): phase r holds positions r, r + s, r + 2s, ...
        q, k, v = (x.reshape(B, h, n // width, width, d).transpose(2, 3) for x in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return out.transpose(2, 3).reshape(B, h, n, d)
    out = torch.empty_like(q)
    groups = [torch.arange(r, n, width) for r in range(min(width, n))] if kind == "strided" else \
        [torch.arange(s, min(s + width, n)) for s in range(0, n, width)]
    for idx in groups:
        out[..., idx, :] = F.scaled_dot_product_attention(q[..., idx, :], k[..., idx, :], v[..., idx, :],
                                                          is_causal=causal)
    return out


@dataclass(frozen=True)
class Measured:
    name: str
    dense_ms: float         # F.scaled_dot_product_attention with the n x n mask
    sliced_ms: float        # the pattern's own kernel (`sliced_attention`)
    max_diff: float         # |dense with mask - sliced|: the same attention


def measure_patterns(kinds: list[str], n: int, width: dict[str, int], d_head: int, causal: bool,
                     repeats: int = REPEATS, check=None, seed: int = 0, clock: str = CLOCK) -> list[Measured]:
    """Time each pattern on random q, k, v (1 x 1 head x n x d_head) with the one timer, on this CPU:
    every kernel runs once untimed first (the first call of a kernel pays its set-up), then each
    pattern's dense and skipping kernels are timed one run at a time, alternating, so that the
    machine's drift falls on both alike."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 1, n, d_head, generator=g) for _ in range(3))
    rows = []
    with torch.inference_mode():
        runs = []
        for kind in kinds:
            w = width.get(kind, 1)
            mask = pattern_mask(kind, n, w, causal)
            dense = partial(F.scaled_dot_product_attention, q, k, v, attn_mask=mask)
            sliced = partial(sliced_attention, kind, q, k, v, w, causal)
            diff = float((dense() - sliced()).abs().max())          # also the untimed first calls
            runs.append((pattern_name(kind, w), dense, sliced, diff))
        for name, dense, sliced, diff in runs:
            measure(dense, 1, 1, check=check, clock=clock)         # warm again just before
            measure(sliced, 1, 1, check=check, clock=clock)
            t_dense, t_sliced = [], []
            for _ in range(repeats):
                t_dense += measure(dense, 1, 0, check=check, clock=clock).times
                t_sliced += measure(sliced, 1, 0, check=check, clock=clock).times
            rows.append(Measured(name, Timing.of(t_dense).median_ms, Timing.of(t_sliced).median_ms, diff))
    return rows
