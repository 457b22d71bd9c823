"""One attention head recomputed step by step from a trace (Q, K, V, scores, mask, softmax,
weighted values, its share of the output), checked against what the model captured.

Reads a loaded `Model` and never changes it: models are shared by every session.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from attnviz.core.model import Model, Trace


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
    q_rows = slice(local * dh, (local + 1) * dh)
    k_rows = slice((h + kv) * dh, (h + kv + 1) * dh)
    v_rows = slice((h + hkv + kv) * dh, (h + hkv + kv + 1) * dh)
    steps: dict[str, Step] = {}

    def add(key, name, value, rows, cols, note=""):
        steps[key] = Step(name, value.detach(), rows, cols, note)

    with torch.inference_mode():
        x = trace.states[layer]                                            # (n, d_model)
        # what the block's attention computes for this input: read, never rebuilt from the config
        scored = block.explain(x[None], **model.net.shared(n))
        causal = scored.causal if causal is None else causal
        add("input", f"x: input of block {layer}", x, "tokens", "d_model",
            "the residual stream entering the block")
        if not torch.equal(scored.x[0], x):
            add("normed", "norm1(x)", scored.x[0], "tokens", "d_model",
                f"{cfg.norm} before attention (a pre-norm block)")
        Wq, Wk, Wv = W[q_rows].T, W[k_rows].T, W[v_rows].T                # (d_model, dh) each
        group = f" (K/V head {kv}, shared by {cfg.group} query heads)" if cfg.group > 1 else ""
        add("W_Q", f"W_Q of head {head}", Wq, "d_model", "d_head", "its rows of the fused qkv weight")
        add("W_K", f"W_K{group}", Wk, "d_model", "d_head")
        add("W_V", f"W_V{group}", Wv, "d_model", "d_head")
        add("Q", "Q = x·W_Q + b_Q", scored.q_proj[0, local], "tokens", "d_head")
        add("K", "K = x·W_K + b_K", scored.k_proj[0, kv], "tokens", "d_head")
        add("V", "V = x·W_V + b_V", scored.v[0, kv], "tokens", "d_head")
        if scored.q_normed is not None:
            over = "every head's channels at once" if cfg.qk_norm == "all" else "its head's channels"
            add("Q_norm", "RMSNorm(Q)", scored.q_normed[0, local], "tokens", "d_head",
                f"each query normalised over {over} (QK-norm)")
            add("K_norm", "RMSNorm(K)", scored.k_normed[0, kv], "tokens", "d_head", "likewise each key")
        Q, K, V = scored.q[0, local], scored.k[0, kv], scored.v[0, kv]   # (n, dh) as scored
        if scored.rotated:
            part = f" (its first {cfg.rotary_dim} channels)" if cfg.rotary_dim else ""
            add("Q_rot", "RoPE(Q)", Q, "tokens", "d_head", f"queries rotated by their position's angle{part}")
            add("K_rot", "RoPE(K)", K, "tokens", "d_head", "keys rotated likewise: Q·K then depends on distance")
        add("scores", "scores = Q·Kᵀ", Q @ K.T, "tokens", "tokens")
        scaled = scored.logits(temperature=temperature)[0, local]        # (n, n)
        how = f"× {scored.scale_value:.4g}" if scored.scale is not None else f"/ √{dh}"
        cap = f", then soft-capped: {scored.softcap:g}·tanh(s / {scored.softcap:g})" if scored.softcap else ""
        t_note = f", then divided by the temperature {temperature:g}" if temperature != 1 else ""
        alibi = ""
        if scored.bias is not None and attn.slopes is not None:  # ALiBi: the head's slope times each key's position
            how += " + ALiBi"
            alibi = f", plus the head's ALiBi bias {float(attn.slopes[local]):.4g} × key position"
        elif scored.bias is not None:  # a learned bias per distance (relative positions)
            how += " + position bias"
            alibi = ", plus the head's learned bias for each query-key distance"
        add("scaled", f"scaled = scores {how}" + (f" / {temperature:g}" if temperature != 1 else ""),
            scaled, "tokens", "tokens", f"multiplied by {scored.scale_value:.4g}{cap}{alibi}{t_note}")
        allowed = replace(scored, causal=causal).mask()
        allowed = torch.ones(n, n, dtype=torch.bool) if allowed is None else allowed.reshape(-1, n, n)[0].clone()
        if hidden_keys:
            allowed[:, list(hidden_keys)] = False
        empty = (~allowed.any(-1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"query positions {empty} would see no key at all: unhide a key they may see")
        window = f"; keys within {scored.window} positions" if scored.window else ""
        add("mask", "mask (1 = may attend)", allowed.float(), "tokens", "tokens",
            ("causal: no looking ahead" if causal else "bidirectional") + window +
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
            "added with the other heads' outputs and b_O to the attention's output")

    captured = None
    if trace.attentions is not None and layer in trace.layers:
        captured = trace.attentions[trace.layers.index(layer), head]
    changed = temperature != 1.0 or causal != scored.causal or bool(hidden_keys)
    diff = None if captured is None else (pattern - captured).abs().max().item()
    return HeadSteps(layer, head, kv, trace.tokens, steps, pattern, captured, diff, changed,
                     _output_diff(model, trace, layer) if check_output else None, temperature)


def _output_diff(model: Model, trace: Trace, layer: int) -> float:
    """The heads' shares of W_O add up, with b_O, to what the attention module outputs."""
    block = model.net.blocks[layer]
    attn = block.attn
    with torch.inference_mode():
        x = trace.states[layer][None]
        shared = model.net.shared(x.shape[1])
        y, att = attn(block.attn_input(x), need_weights=True, **shared)
        z = att @ block.explain(x, **shared).values()                          # (1, h, n, dh)
        z = z.transpose(1, 2).reshape(1, x.shape[1], -1)                       # (1, n, h dh)
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
