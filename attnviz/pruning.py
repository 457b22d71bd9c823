"""Physical pruning: a NEW, smaller model without the removed heads; the original is untouched.

Pruning a head removes its rows from the fused QKV projection and its columns from the output
projection. With grouped K/V heads a K/V head stays while any kept query head reads it.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from .model import Transformer


def check_keep(keep, n_layers: int, n_heads: int) -> torch.Tensor:
    keep = torch.as_tensor(keep)
    if tuple(keep.shape) != (n_layers, n_heads):
        raise ValueError(f"keep must have shape [{n_layers}, {n_heads}] (layers x heads); got {list(keep.shape)}")
    if keep.dtype != torch.bool:
        if not torch.all((keep == 0) | (keep == 1)):
            raise ValueError("keep must be boolean (True keeps a head)")
        keep = keep.bool()
    return keep


def prune_model(model, keep):
    """`model.prune(keep)`: keep is BoolTensor[n_layers, n_heads] in the ORIGINAL head numbering."""
    from .api import Model
    cfg, net = model.cfg, model.net
    keep = check_keep(keep, cfg.n_layers, cfg.n_heads) & model.kept  # already-pruned heads stay gone
    heads, kv_heads = [], []
    for i in range(cfg.n_layers):
        kept = [h for h in range(cfg.n_heads) if keep[i, h]]
        heads.append(kept)
        kv_heads.append(sorted({h // cfg.group for h in kept}))
    new_cfg = cfg.replace(head_dims=tuple(len(h) for h in heads), kv_dims=tuple(len(k) for k in kv_heads))
    small = Transformer(new_cfg, heads, kv_heads)
    state = {k: v for k, v in net.state_dict().items()}
    for i, block in enumerate(net.blocks):
        old = block.attn
        dh, old_heads = cfg.d_head, old.heads.tolist()
        old_kv = sorted({h // cfg.group for h in old_heads})
        rows = lambda idx, base: [base + j * dh + r for j in idx for r in range(dh)]  # noqa: E731
        q_idx = [old_heads.index(h) for h in heads[i]]
        kv_idx = [old_kv.index(k) for k in kv_heads[i]]
        hq, hkv = old.n_heads, old.n_kv
        sel = rows(q_idx, 0) + rows(kv_idx, hq * dh) + rows(kv_idx, (hq + hkv) * dh)
        sel = torch.tensor(sel, dtype=torch.long)
        p = f"blocks.{i}.attn."
        state[p + "qkv.weight"] = state[p + "qkv.weight"][sel]
        if p + "qkv.bias" in state:
            state[p + "qkv.bias"] = state[p + "qkv.bias"][sel]
        state[p + "out.weight"] = state[p + "out.weight"][:, torch.tensor(rows(q_idx, 0), dtype=torch.long)]
    small.load_state_dict(state)
    info = replace(model.info, key=f"{model.info.key} (pruned {int((~keep).sum())}/{keep.numel()})")
    return Model(small, info, model.tokenizer, image_mean=model.image_mean, image_std=model.image_std,
                 image_size=model.image_size, decoder=model.decoder, kept=keep)
