"""The permutation-equivariance demonstration: without positional information (and without a
causal mask) shuffling the tokens shuffles the attention the same way.

Reads a loaded `Model` and never changes it: the positionless model is a copy.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.base.limits import LIMITS
from attnviz.core.model import Model
from attnviz.core.transformer import Transformer


@dataclass
class Permutation:
    tokens: list[str]
    order: list[int]                 # shuffled position i holds original token order[i]
    attentions: torch.Tensor         # [L, H, n, n] of the original order
    shuffled: torch.Tensor           # [L, H, n, n] of the shuffled input
    max_diff: float                  # |shuffled - original permuted by `order`|
    hidden_diff: float               # same for the final hidden states
    causal: bool
    layers: list[int] | None = None  # the layers `attentions` and `shuffled` hold (None: all)


FLOAT64_MAX_PARAMS = 50_000_000  # a float64 copy of a bigger model costs too much memory


def without_positions(model: Model, dtype: torch.dtype | None = None) -> Model:
    """A copy of the model with its position information removed (no table, no rotation).
    Small models are copied in float64, so equivariance shows to ~1e-15 instead of float32
    rounding (~1e-7)."""
    if model.cfg.is_vision:
        raise ValueError("the permutation demonstration needs a text model")
    if dtype is None:
        dtype = torch.float64 if model.num_params() <= FLOAT64_MAX_PARAMS else torch.float32
    cfg = model.cfg.replace(positional="none")
    state = {k: v for k, v in model.net.state_dict().items() if k != "pos.weight"}
    net = Transformer(cfg).to(dtype)
    # same dtype: share the weight tensors (read-only here) instead of copying a big model
    net.load_state_dict(state, assign=next(iter(state.values())).dtype == dtype)
    return Model(net, model.info, model.tokenizer)


def shuffle_order(n: int, special: list[bool] | None = None, seed: int = 0) -> list[int]:
    """A random permutation that keeps special tokens ([CLS], [SEP]) in place."""
    movable = [i for i in range(n) if not (special and special[i])]
    g = torch.Generator().manual_seed(seed)
    shuffled = [movable[j] for j in torch.randperm(len(movable), generator=g).tolist()]
    order, it = list(range(n)), iter(shuffled)
    return [next(it) if i in movable else i for i in order]


def permutation_test(model: Model, x, order: list[int] | None = None, seed: int = 0,
                     layers: list[int] | None = None, check=None) -> Permutation:
    """Run ids and ids[order]; return how far the shuffled attention is from the original one
    with rows and columns permuted the same way. Zero (to rounding) exactly when nothing in the
    model tells positions apart: no positional encoding and no causal mask. Text is cut to
    LIMITS.lab_max_tokens tokens.

    Both orders run side by side (a batch of two) through the block loop, one layer at a time:
    the difference is measured over every layer, but only `layers`' attention is kept (all when
    None), so the work holds one layer's weights instead of every layer's twice (SmolLM2 at 512
    tokens: 9 MB a layer against 280 MB for all of them, per order). `check()` runs before every
    block (a deadline's or a cancel's) and raises to stop."""
    if isinstance(x, str):
        x = model.encode_text(x)[0][: LIMITS.lab_max_tokens]
    if model.cfg.is_vision:
        raise ValueError("the permutation demonstration needs a text model")
    inp = model.inputs(x)
    ids = inp["ids"]
    n = len(ids)
    if n < 2:
        raise ValueError("shuffling needs at least two tokens")
    order = shuffle_order(n, inp["special"].tolist(), seed) if order is None else list(order)
    if sorted(order) != list(range(n)):
        raise ValueError(f"order must be a permutation of 0..{n - 1}")
    keep = set(model.check_layers(layers))
    idx = torch.tensor(order)
    net = model.net
    original, moved, max_diff = [], [], 0.0
    with torch.inference_mode():
        h = net.embed_text(torch.stack([ids, ids[idx]]))          # (2, n, d): both orders
        for step in net.iter_blocks(h, capture=range(model.cfg.n_layers), check=check):
            a, b = step.weights[0], step.weights[1]               # (H, n, n) each
            max_diff = max(max_diff, (b - a[:, idx][:, :, idx]).abs().max().item())
            if step.layer in keep:                                # copies: the batch is not pinned
                original.append(a.clone())
                moved.append(b.clone())
            h = step.out
        hidden, _ = net.finish(h, logits=False)                  # (2, n, d)
    return Permutation(inp["tokens"], order, torch.stack(original), torch.stack(moved), max_diff,
                       (hidden[1] - hidden[0][idx]).abs().max().item(), model.cfg.causal,
                       None if layers is None else sorted(keep))
