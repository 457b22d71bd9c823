"""The lab's library: one head recomputed step by step from a trace, positional encodings as
tables, the permutation-equivariance demonstration, and attention variants swapped into a
pretrained model with fidelity and speed measured.

Everything here reads a loaded `Model` and never changes it: models are shared by every session.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnviz.core.model import Model, Trace
from attnviz.core.attention import parse_variant
from attnviz.base.limits import LIMITS
from attnviz.base.timing import Timing, measure
from attnviz.core.transformer import Transformer, sentence_embedding
from attnviz.core.positional import alibi_bias, apply_rope, rope_cos_sin, sinusoidal


# ---------------------------------------------------------------- step by step
@dataclass
class Step:
    name: str            # what the page shows as the heading, e.g. "Q = x·W_Q + b_Q"
    value: torch.Tensor  # 2-D
    rows: str            # what the rows are: "tokens", "d_model", "d_head"
    cols: str
    note: str = ""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)


@dataclass
class HeadSteps:
    layer: int
    head: int
    kv_head: int
    tokens: list[str]
    steps: dict[str, Step]          # in order: input … head output
    pattern: torch.Tensor           # [n, n], the recomputed softmax
    captured: torch.Tensor | None   # [n, n], what the model captured in the trace
    max_abs_diff: float | None      # |pattern - captured|, None when nothing was captured
    changed: bool                   # temperature or mask toggles differ from the model's own
    output_diff: float | None = None  # |Σ heads' shares + b_O - the module's output|
    temperature: float = 1.0        # what the scaled scores were divided by, after √d_head


def check_head(model: Model, layer: int, head: int) -> None:
    cfg = model.cfg
    if not 0 <= layer < cfg.n_layers:
        raise ValueError(f"layer {layer} is out of range: {model.info.key} has layers 0..{cfg.n_layers - 1}")
    if not 0 <= head < cfg.n_heads:
        raise ValueError(f"head {head} is out of range: {model.info.key} has heads 0..{cfg.n_heads - 1} "
                         "per layer (the model changed? pick the head again)")
    if head not in model.net.blocks[layer].attn.heads.tolist():
        raise ValueError(f"head {head} of layer {layer} was pruned from this model")


def head_steps(model: Model, trace: Trace, layer: int, head: int, *, temperature: float = 1.0,
               causal: bool | None = None, hidden_keys: tuple[int, ...] = (),
               check_output: bool = True) -> HeadSteps:
    """Recompute one head from the block input in `trace.states` (a trace made with states=True).

    `temperature` divides the scaled scores; `causal` (None: the model's own) and `hidden_keys`
    (key positions no query may see) are the mask toggles. `check_output` also checks that the
    layer's heads add up to its attention output (one extra pass over the layer)."""
    check_head(model, layer, head)
    if trace.states is None:
        raise ValueError("the trace has no block inputs: make it with model.trace(x, states=True)")
    n = trace.n
    if n < 2:
        raise ValueError("one token can only attend to itself (its weight is always 1): "
                         "type a sentence of at least two tokens")
    if not temperature > 0:
        raise ValueError("temperature must be positive")
    bad = [k for k in hidden_keys if not 0 <= k < n]
    if bad:
        raise ValueError(f"hidden key positions {bad} are outside 0..{n - 1}")
    cfg, block = model.cfg, model.net.blocks[layer]
    attn, dh = block.attn, cfg.d_head
    local = attn.heads.tolist().index(head)
    kv = int(attn.kv_of_head[local])
    h, hkv = attn.n_heads, attn.n_kv
    W = attn.qkv.weight                                     # ((h + 2 hkv) dh, d_model)
    b = attn.qkv.bias if attn.qkv.bias is not None else torch.zeros(W.shape[0])
    q_rows = slice(local * dh, (local + 1) * dh)
    k_rows = slice((h + kv) * dh, (h + kv + 1) * dh)
    v_rows = slice((h + hkv + kv) * dh, (h + hkv + kv + 1) * dh)
    causal = cfg.causal if causal is None else causal
    steps: dict[str, Step] = {}

    def add(key, name, value, rows, cols, note=""):
        steps[key] = Step(name, value.detach(), rows, cols, note)

    with torch.inference_mode():
        x = trace.states[layer]                                            # (n, d_model)
        add("input", f"x: input of block {layer}", x, "tokens", "d_model",
            "the residual stream entering the block")
        if cfg.pre_norm:
            x = block.norm1(x)
            add("normed", "norm1(x)", x, "tokens", "d_model",
                f"{cfg.norm} before attention ({cfg.family} is pre-norm)")
        Wq, Wk, Wv = W[q_rows].T, W[k_rows].T, W[v_rows].T                # (d_model, dh) each
        group = f" (K/V head {kv}, shared by {cfg.group} query heads)" if cfg.group > 1 else ""
        add("W_Q", f"W_Q of head {head}", Wq, "d_model", "d_head", "its rows of the fused qkv weight")
        add("W_K", f"W_K{group}", Wk, "d_model", "d_head")
        add("W_V", f"W_V{group}", Wv, "d_model", "d_head")
        Q, K, V = x @ Wq + b[q_rows], x @ Wk + b[k_rows], x @ Wv + b[v_rows]  # (n, dh)
        add("Q", "Q = x·W_Q + b_Q", Q, "tokens", "d_head")
        add("K", "K = x·W_K + b_K", K, "tokens", "d_head")
        add("V", "V = x·W_V + b_V", V, "tokens", "d_head")
        if cfg.positional == "rotary":
            cos, sin = model.net.rope(n)
            Q, K = apply_rope(Q, cos, sin), apply_rope(K, cos, sin)
            add("Q_rot", "RoPE(Q)", Q, "tokens", "d_head", "queries rotated by their position's angle")
            add("K_rot", "RoPE(K)", K, "tokens", "d_head", "keys rotated likewise: Q·K then depends on distance")
        scores = Q @ K.T                                                   # (n, n)
        add("scores", "scores = Q·Kᵀ", scores, "tokens", "tokens")
        scaled = scores / math.sqrt(dh) / temperature
        t_note = f", then by the temperature {temperature:g}" if temperature != 1 else ""
        add("scaled", f"scaled = scores / √{dh}" + (f" / {temperature:g}" if temperature != 1 else ""),
            scaled, "tokens", "tokens", f"divided by √d_k = {math.sqrt(dh):.2f}{t_note}")
        allowed = torch.ones(n, n, dtype=torch.bool)
        if causal:
            allowed = allowed.tril()
        if hidden_keys:
            allowed[:, list(hidden_keys)] = False
        empty = (~allowed.any(-1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"query positions {empty} would see no key at all: unhide a key they may see")
        add("mask", "mask (1 = may attend)", allowed.float(), "tokens", "tokens",
            ("causal: no looking ahead" if causal else "bidirectional") +
            (f"; keys {list(hidden_keys)} hidden" if hidden_keys else ""))
        masked = scaled.masked_fill(~allowed, float("-inf"))
        add("masked", "masked scores", masked, "tokens", "tokens", "−∞ where the mask is 0")
        pattern = torch.softmax(masked, dim=-1)
        add("softmax", "A = softmax(masked)", pattern, "tokens", "tokens", "every row sums to 1")
        z = pattern @ V                                                     # (n, dh)
        add("weighted", "z = A·V", z, "tokens", "d_head", "each token's weighted sum of values")
        Wo = attn.out.weight[:, local * dh:(local + 1) * dh].T            # (dh, d_model)
        add("W_O", f"W_O share of head {head}", Wo, "d_head", "d_model",
            "its columns of the output projection")
        add("output", "head output = z·W_O", z @ Wo, "tokens", "d_model",
            "added with the other heads' outputs and b_O to the residual stream")

    captured = None
    if trace.attentions is not None and layer in trace.layers:
        captured = trace.attentions[trace.layers.index(layer), head]
    changed = temperature != 1.0 or causal != cfg.causal or bool(hidden_keys)
    diff = None if captured is None else (pattern - captured).abs().max().item()
    return HeadSteps(layer, head, kv, trace.tokens, steps, pattern, captured, diff, changed,
                     _output_diff(model, trace, layer) if check_output else None, temperature)


def _output_diff(model: Model, trace: Trace, layer: int) -> float:
    """The heads' shares of W_O add up, with b_O, to what the attention module outputs."""
    cfg, block = model.cfg, model.net.blocks[layer]
    attn = block.attn
    with torch.inference_mode():
        x = trace.states[layer][None]
        x = block.norm1(x) if cfg.pre_norm else x
        rope = model.net.rope(x.shape[1]) if cfg.positional == "rotary" else None
        y, att = attn(x, rope=rope, causal=cfg.causal, need_weights=True)
        V = attn.qkv(x)[..., (attn.n_heads + attn.n_kv) * cfg.d_head:]       # (1, n, hkv dh)
        V = V.view(1, -1, attn.n_kv, cfg.d_head).transpose(1, 2)[:, attn.kv_of_head]  # (1, h, n, dh)
        z = (att @ V).transpose(1, 2).reshape(1, x.shape[1], -1)              # (1, n, h dh)
        total = z @ attn.out.weight.T + (attn.out.bias if attn.out.bias is not None else 0)
    return (total - y).abs().max().item()


def verify(model: Model, x, layer: int | None = None) -> float:
    """Max |recomputed - captured| over every head of `layer` (all layers when None)."""
    layers = range(model.cfg.n_layers) if layer is None else [layer]
    tr = model.trace(x, states=True, layers=list(layers))
    worst = 0.0
    for i in layers:
        for h in model.net.blocks[i].attn.heads.tolist():
            worst = max(worst, head_steps(model, tr, i, h, check_output=False).max_abs_diff)
    return worst


# ---------------------------------------------------------------- positional encodings
def learned_table(model: Model) -> torch.Tensor | None:
    """The model's learned position table [positions, d_model], or None if it has none."""
    pos = getattr(model.net, "pos", None)
    if isinstance(pos, torch.nn.Embedding):
        return pos.weight.detach()
    if isinstance(pos, torch.nn.Parameter):  # vision: CLS + patch grid
        return pos.detach()[0]
    return None


def rope_angles(n: int, d_head: int, theta: float = 10000.0) -> torch.Tensor:
    """[n, d_head/2]: the angle (radians, wrapped to [-π, π]) each position turns each pair by."""
    cos, sin = rope_cos_sin(n, d_head, theta)
    half = d_head // 2
    return torch.atan2(sin[:, :half], cos[:, :half])


def rope_similarity(n: int, d_head: int, theta: float = 10000.0) -> torch.Tensor:
    """[n, n]: the dot product of one unit vector placed at positions i and j after rotation.
    It depends only on i - j: RoPE turns content similarity into relative position."""
    u = torch.ones(1, d_head) / math.sqrt(d_head)
    cos, sin = rope_cos_sin(n, d_head, theta)
    rotated = apply_rope(u, cos, sin)                                      # (n, d_head)
    return rotated @ rotated.T


def cosine_similarity(table: torch.Tensor) -> torch.Tensor:
    """[n, n] cosine similarity between the rows of a position table."""
    unit = F.normalize(table.float(), dim=-1)
    return unit @ unit.T


def by_distance(sim: torch.Tensor) -> torch.Tensor:
    """[n]: mean of sim[i, i + k] over i, for each distance k = 0..n-1."""
    n = sim.shape[0]
    return torch.stack([sim.diagonal(k).mean() for k in range(n)])


def sinusoidal_table(n: int, d: int) -> torch.Tensor:
    return sinusoidal(n, d)


def alibi_table(n: int, n_heads: int, causal: bool = True) -> torch.Tensor:
    return alibi_bias(n, n_heads, causal)


# ---------------------------------------------------------------- permutation equivariance
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


# ---------------------------------------------------------------- variants in a pretrained model
@dataclass
class Fidelity:
    label: str
    seconds: float            # median forward time with the variant
    reference_seconds: float  # median forward time of the unchanged model, measured alongside
    kl: float | None = None             # LM: mean KL(reference || variant) per token, nats
    top1: float | None = None           # LM: next-token argmax agreement
    perplexity: float | None = None     # LM: on the text itself
    reference_perplexity: float | None = None
    cosine: float | None = None         # encoder: mean-pooled sentence embedding
    token_cosine: float | None = None   # encoder: mean over tokens

    @property
    def speedup(self) -> float:
        return self.reference_seconds / self.seconds


def variant_fidelity(model: Model, text: str, variants, label: str = "", repeats: int = 3,
                     check=None) -> Fidelity:
    """Swap attention variants into the chosen layers (`variants`: a spec for every layer or
    {layer: spec}) and compare with the unchanged model on `text`. `check()` (e.g. a deadline's)
    runs before every forward pass and raises to stop."""
    if model.cfg.is_vision:
        raise ValueError("variant fidelity is measured on text models")
    L = model.cfg.n_layers
    if isinstance(variants, dict):
        bad = [k for k in variants if not 0 <= int(k) < L]
        if bad:
            raise ValueError(f"variant layers {bad} are outside 0..{L - 1}")
        spec = {int(k): parse_variant(v) for k, v in variants.items()}
    else:
        spec = parse_variant(variants)
    inp = model.inputs(text)
    ids = inp["input_ids"][:, : LIMITS.lab_max_tokens]  # bounded: explicit variants hold n x n per head
    if ids.shape[1] < 2:
        raise ValueError("the text needs at least two tokens to compare next-token predictions")
    net = model.net
    with torch.inference_mode():
        run_ref = lambda: net(input_ids=ids)                    # noqa: E731  fused softmax
        run_var = lambda: net(input_ids=ids, variants=spec)     # noqa: E731
        if check is not None:
            check()
        ref = run_ref()                                         # also the warm-up
        if check is not None:
            check()
        var = run_var()
        t_ref, t_var = [], []
        for _ in range(repeats):  # alternate, so both see the same machine load
            t_ref += measure(run_ref, 1, 0, check=check).times
            t_var += measure(run_var, 1, 0, check=check).times
    out = Fidelity(label or str(variants), Timing.of(t_var).median, Timing.of(t_ref).median)
    if ref.logits is not None and model.cfg.causal:
        logp_ref = ref.logits[0].float().log_softmax(-1)       # (n, vocab)
        logp_var = var.logits[0].float().log_softmax(-1)
        out.kl = (logp_ref.exp() * (logp_ref - logp_var)).sum(-1).mean().item()
        out.top1 = (logp_ref.argmax(-1) == logp_var.argmax(-1)).float().mean().item()
        target = ids[0, 1:]
        out.reference_perplexity = math.exp(F.nll_loss(logp_ref[:-1], target).item())
        out.perplexity = math.exp(F.nll_loss(logp_var[:-1], target).item())
    else:
        a, b = ref.hidden[0].float(), var.hidden[0].float()   # (n, d_model)
        out.cosine = float(sentence_embedding(a) @ sentence_embedding(b))   # the pooled embeddings
        out.token_cosine = F.cosine_similarity(a, b, dim=-1).mean().item()
    return out
