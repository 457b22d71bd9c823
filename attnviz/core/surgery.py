"""Physical pruning: a NEW, smaller transformer without the removed heads; the original is untouched.

Pruning a head removes its rows from the fused QKV projection and its columns from the output
projection. With grouped K/V heads a K/V head stays while any kept query head reads it. A QK-norm
over the whole layer (OLMo 2) averages over every head's channels: the dropped heads' Q and K rows
move to the layer's `q_rest` / `k_rest`, which only that norm reads.
`Model.prune` wraps the result in a new `Model`; `Seq2SeqModel.prune` takes cross-attention heads out
of a copy of its decoder through `sliced_attention`.
"""
from __future__ import annotations

import torch

from attnviz.core.blocks import Attention
from attnviz.core.config import Config
from attnviz.core.transformer import Transformer


def check_keep(keep, n_layers: int, n_heads: int) -> torch.Tensor:
    """`keep` as a BoolTensor [n_layers, n_heads] (True keeps a head); ValueError otherwise."""
    keep = torch.as_tensor(keep)
    if tuple(keep.shape) != (n_layers, n_heads):
        raise ValueError(f"keep must have shape [{n_layers}, {n_heads}] (layers x heads); got {list(keep.shape)}")
    if keep.dtype != torch.bool:
        if not torch.all((keep == 0) | (keep == 1)):
            raise ValueError("keep must be boolean (True keeps a head)")
        keep = keep.bool()
    return keep


def prune(net: Transformer, keep, kept: torch.Tensor) -> tuple[Transformer, torch.Tensor]:
    """(smaller transformer, heads it keeps). `keep` and `kept` (the heads `net` still has) are
    BoolTensors [n_layers, n_heads] in the ORIGINAL head numbering; heads already pruned stay gone."""
    cfg = net.cfg
    keep = check_keep(keep, cfg.n_layers, cfg.n_heads) & kept
    heads, kv_heads = [], []
    for i in range(cfg.n_layers):
        on = [h for h in range(cfg.n_heads) if keep[i, h]]
        heads.append(on)
        kv_heads.append(sorted({h // cfg.group for h in on}))
    new_cfg = cfg.replace(head_dims=tuple(len(h) for h in heads), kv_dims=tuple(len(k) for k in kv_heads))
    state = dict(net.state_dict())
    dh = cfg.d_head

    def rows(idx, base):  # the d_head rows of each listed head, in a projection starting at `base`
        return [base + j * dh + r for j in idx for r in range(dh)]

    for i, block in enumerate(net.blocks):
        old = block.attn
        old_heads = old.heads.tolist()
        old_kv = sorted({h // cfg.group for h in old_heads})
        q_idx = [old_heads.index(h) for h in heads[i]]
        kv_idx = [old_kv.index(k) for k in kv_heads[i]]
        hq, hkv = old.n_heads, old.n_kv
        # fused qkv rows: [Q (hq * dh) | K (hkv * dh) | V (hkv * dh)]
        sel = torch.tensor(rows(q_idx, 0) + rows(kv_idx, hq * dh) + rows(kv_idx, (hq + hkv) * dh),
                           dtype=torch.long)
        p = f"blocks.{i}.attn."
        if cfg.qk_norm == "all":  # a layer-wide QK-norm: the dropped heads' Q and K rows still count in it
            for name, dropped, base in (("q", [j for j in range(hq) if j not in q_idx], 0),
                                        ("k", [j for j in range(hkv) if j not in kv_idx], hq * dh)):
                gone = torch.tensor(rows(dropped, base), dtype=torch.long)
                for part in ("weight", "bias"):
                    if p + f"qkv.{part}" in state:
                        moved = [state[p + f"{name}_rest.{part}"]] if p + f"{name}_rest.{part}" in state else []
                        rest = torch.cat(moved + [state[p + f"qkv.{part}"][gone]])
                        if len(rest):
                            state[p + f"{name}_rest.{part}"] = rest
                kept_rows = torch.tensor(rows(q_idx if name == "q" else kv_idx, 0), dtype=torch.long)
                state[p + f"{name}_norm.weight"] = state[p + f"{name}_norm.weight"][kept_rows]
        for name in ("pos_q", "pos_k"):  # DeBERTa's own position projections: rows per query head
            for part in ("weight", "bias"):
                if p + f"{name}.{part}" in state:
                    state[p + f"{name}.{part}"] = state[p + f"{name}.{part}"][torch.tensor(rows(q_idx, 0))]
        state[p + "qkv.weight"] = state[p + "qkv.weight"][sel]
        if p + "qkv.bias" in state:
            state[p + "qkv.bias"] = state[p + "qkv.bias"][sel]
        state[p + "out.weight"] = state[p + "out.weight"][:, torch.tensor(rows(q_idx, 0), dtype=torch.long)]
        if p + "rel_bias" in state:  # a relative position bias: one column per head
            state[p + "rel_bias"] = state[p + "rel_bias"][:, torch.tensor(q_idx, dtype=torch.long)]
    # clone: the new model owns its tensors, so nothing done to it can reach the original
    return Transformer.from_state(new_cfg, {k: v.clone() for k, v in state.items()}, heads, kv_heads), keep


def sliced_attention(attn: Attention, cfg: Config, on: list[int]) -> Attention:
    """A NEW un-fused attention layer (queries from `q`, keys and values from `kv`: the decoders'
    cross-attention) keeping query heads `on` (ORIGINAL numbering; a subset of those `attn` holds)
    and the K/V heads they read; its tensors are copies, `attn` is untouched."""
    dh, old = cfg.d_head, attn.heads.tolist()
    kv_on, old_kv = sorted({h // cfg.group for h in on}), sorted({h // cfg.group for h in old})
    q_idx, kv_idx = [old.index(h) for h in on], [old_kv.index(k) for k in kv_on]

    def rows(idx, base):  # the d_head rows of each listed head, in a projection starting at `base`
        return torch.tensor([base + j * dh + r for j in idx for r in range(dh)], dtype=torch.long)

    # kv rows: [K (h_kv * dh) | V (h_kv * dh)]
    pick = {"q": rows(q_idx, 0), "kv": torch.cat([rows(kv_idx, 0), rows(kv_idx, attn.n_kv * dh)])}
    state = {}
    for name, t in attn.state_dict().items():
        layer, part = name.split(".")
        if layer in pick:
            t = t[pick[layer]]
        elif layer == "out" and part == "weight":
            t = t[:, pick["q"]]
        state[name] = t.clone()
    small = Attention(cfg, on, kv_on, fused=False)
    small.load_state_dict(state)
    return small.eval()
