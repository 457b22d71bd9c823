"""What the Attention page shows besides raw attention: bounded capture of long texts, next-token
top-k for language models and sentence similarity for encoders. No Streamlit here.

Memory rule for text capture: never hold L x H x n x n when that is large. SmolLM2 allows 8,192
positions, and 30 x 9 x 8192^2 float32 weights are 72 GB. `capture_text` therefore keeps
  * the whole attention when L*H*n*n fits ``budget`` floats (every short and medium text), else
  * a pooled overview of every layer x head ([L, H, m, m], m <= max_cell, equal to
    `analysis.downsample_attention` of the full tensor) plus the exact weights of one square
    window of tokens in every layer ([L, H, W, W]); both are built in one pass through the blocks,
    from each block's own weights while one layer's H x n x n fit a chunk, else recomputed
    query-chunk by query-chunk, so the peak is about H x chunk x n floats per layer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from attnviz.analysis import effects
from attnviz.analysis.stats import downsample_attention
from attnviz.base import memory
from attnviz.base.jobs import Cancel, Deadline, JobTimeout, heavy_job
from attnviz.base.limits import LIMITS
from attnviz.core.transformer import sentence_embedding

CHUNK_FLOATS = 1 << 24     # H x chunk x n floats per scored query chunk (64 MB) in the long path
# The most tokens one capture analyses. The scan's time grows with the square of the length:
# SmolLM2 took 489 s for its full 8,192 positions on a 2-core CPU, and 119 s for 2,048 with
# that CPU shared four ways (about 30-40 s when it is not): LIMITS.max_capture_tokens (2,048).
IN_FORCE = -1  # a `max_tokens` default: LIMITS.max_capture_tokens when called (None: no cut)


def full_budget() -> int:
    """Floats of L*H*n*n captured at once (LIMITS.attention_capture_mb, 128 MB: every MiniLM input fits)."""
    return LIMITS.attention_capture_mb * 2**20 // 4


@dataclass
class TextCapture:
    """One text's attention, bounded. ``attentions`` covers tokens ``start .. start + size``."""
    tokens: list[str]            # all n tokens of the (possibly truncated) text
    special: torch.Tensor        # [n] bool
    ids: torch.Tensor            # [n]
    hidden: torch.Tensor         # [n, d_model] final hidden states (last_hidden_state)
    attentions: torch.Tensor     # [L, H, W, W] exact weights: queries and keys of the window
    overview: torch.Tensor       # [L, H, m, m] pooled whole-text attention, m <= max_cell
    start: int = 0               # first token of the window
    truncated: int = 0           # tokens dropped to fit the model's positions or the token cap
    token_limit: int = 0         # the length the text was cut to when truncated

    @property
    def n(self) -> int:
        return len(self.tokens)

    @property
    def size(self) -> int:
        return self.attentions.shape[-1]

    @property
    def full(self) -> bool:
        """The window is the whole text: every row is a complete distribution."""
        return self.start == 0 and self.size == self.n

    @property
    def window_tokens(self) -> list[str]:
        return self.tokens[self.start: self.start + self.size]


def window_size(n_layers: int, n_heads: int, budget: int | None = None,
                max_window: int | None = None) -> int:
    """Largest W with L*H*W*W <= budget (at most ``max_window``): the full-capture limit.
    Defaults: `full_budget()` and LIMITS.attention_window_tokens (the detail views' most per axis)."""
    budget = full_budget() if budget is None else budget
    max_window = LIMITS.attention_window_tokens if max_window is None else max_window
    return max(1, min(max_window, math.isqrt(budget // max(1, n_layers * n_heads))))


def capture_text(model, text_or_ids, *, start: int = 0, max_cell: int = 64,
                 budget: int | None = None, max_window: int | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 max_tokens: int | None = IN_FORCE, max_seconds: float | None = None,
                 cancel: Cancel | None = None) -> TextCapture:
    """Attention of a text model on ``text_or_ids`` within the memory bound described above.

    ``start`` is the first token of the window (clipped so the window fits); it only matters
    when the text is longer than the window. ``progress(done, total)`` is called after every
    layer. A text longer than ``max_tokens`` is cut to that many tokens first (the scan's work
    grows with the square of the length; ``truncated`` and ``token_limit`` say so).

    A text longer than the window takes the layer-by-layer scan: it holds one of the server's
    heavy-job slots (`jobs.ServerBusy` at once when none is free), stops with `jobs.JobTimeout`
    after ``max_seconds`` (LIMITS.max_capture_seconds when None) and with `jobs.JobCancelled`
    when ``cancel`` is set; all three are ValueErrors whose message says what to do.
    """
    cfg = model.cfg
    if cfg.is_vision:
        raise ValueError(f"model {model.info.key!r} takes images; use the Images page")
    inp = model.inputs(text_or_ids)
    ids, tokens, special, truncated = inp["ids"], inp["tokens"], inp["special"], inp["truncated"]
    limit = cfg.max_positions
    max_tokens = LIMITS.max_capture_tokens if max_tokens == IN_FORCE else max_tokens
    if max_tokens is not None and len(ids) > max_tokens:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        truncated += len(ids) - max_tokens
        ids, tokens, special = ids[:max_tokens], tokens[:max_tokens], special[:max_tokens]
        limit = max_tokens
    n = len(ids)
    size = min(n, window_size(cfg.n_layers, cfg.n_heads, budget, max_window))
    start = max(0, min(int(start), n - size))
    m = min(n, max_cell)  # the one estimate decides: whole, or layer by layer (its chunk, overview and window)
    plan = memory.plan_capture("the attention of this text", layers=cfg.n_layers, heads=cfg.n_heads, n=n, chunked=True,
                               budget_mb=(full_budget() if budget is None else budget) * 4 / memory.MB,
                               chunk_bytes=4 * (CHUNK_FLOATS + cfg.n_layers * cfg.n_heads * (m * m + size * size)))
    if plan.mode == "full" and size == n:
        with torch.inference_mode():
            out = model.net(input_ids=ids[None], need_weights=True, logits=False)
        attn = model.assemble(out.attentions, list(range(cfg.n_layers)))   # (L, H, n, n)
        if progress:
            progress(cfg.n_layers, cfg.n_layers)
        hidden, overview, start = out.hidden[0], downsample_attention(attn, max_cell), 0
    else:
        seconds = LIMITS.max_capture_seconds if max_seconds is None else max_seconds
        deadline = Deadline(seconds, f"the layer-by-layer scan of {n:,} tokens")
        done = [0]

        def step(layer_done: int, total: int):
            done[0] = layer_done
            if progress:
                progress(layer_done, total)

        with heavy_job("long text capture"):
            try:
                hidden, overview, attn = _scan(model.net, ids, start, size, max_cell, step,
                                               deadline, cancel)
            except JobTimeout as err:
                raise JobTimeout(
                    f"{err}, after {done[0]} of {cfg.n_layers} layers. Paste a shorter text: the "
                    "scan's work grows with the square of the number of tokens, so half the "
                    "text takes about a quarter of the time.") from None
    return TextCapture(tokens=tokens, special=special, ids=ids, hidden=hidden,
                       attentions=attn, overview=overview, start=start, truncated=truncated,
                       token_limit=limit)


def truncation_message(capture: TextCapture, max_positions: int) -> str | None:
    """What the page says when the text was cut (None when it was not)."""
    if not capture.truncated:
        return None
    if capture.token_limit < max_positions:
        why = (f"the first {capture.token_limit:,} tokens are analysed (the model takes "
               f"{max_positions:,}, but the attention scan grows with the square of the length, "
               "so longer texts are cut to keep a run within minutes)")
    else:
        why = f"the text was cut to the model's {max_positions:,} positions"
    return f"The text is too long: {why}; the last {capture.truncated:,} tokens were dropped."


@torch.inference_mode()
def _scan(net, ids, start: int, size: int, max_cell: int, progress,
          deadline: Deadline | None = None, cancel: Cancel | None = None):
    """One pass through the blocks: pooled overview and the window's weights, layer by layer."""
    cfg = net.cfg
    L, H = cfg.n_layers, cfg.n_heads
    x = net.embed_text(ids[None])
    n = x.shape[1]
    shared = net.shared(n)
    block = math.ceil(n / max_cell)               # as analysis.downsample_attention pools
    m = math.ceil(n / block)
    row_counts = torch.full((m,), float(block))
    row_counts[-1] = n - (m - 1) * block
    # Whole row blocks per chunk, so each pooled row is finished inside one chunk.
    chunk = max(block, CHUNK_FLOATS // (H * n) // block * block)
    overview = torch.zeros(L, H, m, m)
    window = torch.zeros(L, H, size, size)
    stop_w = start + size
    checks = lambda: _check(deadline, cancel)     # noqa: E731  before every block and every chunk
    # When one layer's weights fit a chunk (SmolLM2 up to ~1,300 tokens) the blocks return their
    # own weights and nothing is computed twice; longer texts recompute them chunk by chunk.
    own = H * n * n <= CHUNK_FLOATS
    chunk = n if own else chunk                   # the block's own weights: one chunk of every row
    for step in net.iter_blocks(x, check=checks, capture=range(L) if own else ()):
        layer, blk, x = step.layer, net.blocks[step.layer], step.out
        if blk.attn.n_heads:
            heads = blk.attn.heads                # original indices (pruned models hold fewer)
            if not own:  # what the block's attention computes, read chunk by chunk of query rows
                scored = blk.explain(step.x, **shared)
            for r0 in range(0, n, chunk):
                checks()
                r1 = min(n, r0 + chunk)
                if own:
                    w = step.weights[0]                                          # (h, n, n)
                else:
                    w = scored.weights(r0, r1)[0]                                # (h, r, n)
                keys = F.pad(w, (0, m * block - n)).view(len(heads), r1 - r0, m, block).sum(-1)
                rows = F.pad(keys, (0, 0, 0, -(r1 - r0) % block))             # (h, r', m)
                pooled = rows.view(len(heads), -1, block, m).sum(2)          # (h, r'/b, m)
                b0 = r0 // block
                overview[layer, heads, b0: b0 + pooled.shape[1]] = pooled
                lo, hi = max(r0, start), min(r1, stop_w)
                if lo < hi:
                    window[layer, heads, lo - start: hi - start] = w[:, lo - r0: hi - r0, start:stop_w]
            overview[layer] /= row_counts[:, None]
        if progress:
            progress(layer + 1, L)
    x, _ = net.finish(x, logits=False)
    return x[0], overview, window


def _check(deadline: Deadline | None, cancel: Cancel | None):
    if cancel is not None:
        cancel.check()
    if deadline is not None:
        deadline.check()


def renormalise_rows(attn: torch.Tensor) -> torch.Tensor:
    """Rows rescaled to sum to 1 (a window cut out of a longer text loses the mass outside it);
    all-zero rows stay zero."""
    return attn / attn.sum(-1, keepdim=True).clamp(min=1e-12)


# --- The model's own output -------------------------------------------------------------------
def next_token_topk(model, hidden_row: torch.Tensor, k: int = 10) -> tuple[list[int], torch.Tensor]:
    """Top-k next tokens after one position of a language model: (token ids, probabilities).

    ``hidden_row`` is that position's final hidden state ([d_model], e.g. ``capture.hidden[i]``);
    only this row goes through the LM head, so a long text never makes an [n, vocab] matrix."""
    if model.cfg.task != "lm" or model.net.lm_head is None:
        raise ValueError(f"model {model.info.key!r} is not a language model; next-token "
                         "predictions need one (e.g. smollm2)")
    if hidden_row.dim() != 1 or hidden_row.shape[0] != model.cfg.d_model:
        raise ValueError(f"hidden_row must be [{model.cfg.d_model}], got {tuple(hidden_row.shape)}")
    with torch.inference_mode():
        probs = torch.softmax(model.net.lm_head(hidden_row.float()[None])[0].float(), dim=-1)
    top = probs.topk(min(k, probs.shape[0]))
    return top.indices.tolist(), top.values


def sentence_similarity(model, text_a: str, text_b: str) -> float:
    """Cosine similarity of two texts' pooled, normalised embeddings (in [-1, 1])."""
    embeddings = []
    for text in (text_a, text_b):
        embeddings.append(sentence_embedding(model.trace(text, attentions=False).hidden))
    return float(embeddings[0] @ embeddings[1])


def candidate_labels(model, ids: list[int]) -> list[str]:
    """Readable label of each id on its own (next-token candidates): `effects.token_names`."""
    return effects.token_names(model.tokenizer, ids)


def attention_npz(capture: TextCapture) -> bytes:
    """The capture as a compressed .npz (no pickled objects: ``np.load`` works with
    ``allow_pickle=False``): window attentions [L, H, W, W], pooled overview, tokens, ids, start."""
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.savez_compressed(buffer, attentions=capture.attentions.numpy(),
                        overview=capture.overview.numpy(), tokens=np.array(capture.tokens, dtype=str),
                        ids=capture.ids.numpy(), special=capture.special.numpy(),
                        start=np.int64(capture.start))
    return buffer.getvalue()
