"""What every family converter shares: reading a config field, the activation names, and the one
checked accessor that moves tensors from an HF state dict to ours.

A config may be a transformers config object or a plain dict (GGUF and ONNX readers build dicts).
Missing or misshapen tensors raise ValueError saying which one.
"""
from __future__ import annotations

import re

import torch

ACT = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
       "silu": "silu", "swish": "silu", "relu": "relu", "quick_gelu": "quick_gelu"}


def get(cfg, name: str, default=None):
    """A config field from a transformers config object or a dict."""
    return cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)


def activation(name) -> str:
    if name not in ACT:
        raise ValueError(f"activation {name!r} is not supported; supported: {', '.join(ACT)}")
    return ACT[name]


def rename(sd: dict, rules) -> dict:
    """Apply regex (pattern, replacement) rules to every key, in order."""
    out = {}
    for key, value in sd.items():
        for pattern, repl in rules:
            key = re.sub(pattern, repl, key)
        out[key] = value
    return out


class Mapper:
    """Moves tensors from an HF state dict to ours, checking that each one exists. The prefix is
    the first of `prefixes` the checkpoint uses (task heads wrap the base model: `bert.`,
    `transformer.`, `model.`), or none."""

    def __init__(self, sd: dict, prefixes: tuple[str, ...] = ()):
        self.sd, self.out = sd, {}
        self.prefix = next((p for p in prefixes if any(k.startswith(p) for k in sd)), "")

    def take(self, key: str) -> torch.Tensor:
        full = self.prefix + key
        if full not in self.sd:
            raise ValueError(f"checkpoint is missing tensor {full!r}; is it a complete "
                             "checkpoint of this architecture?")
        return self.sd[full].float()

    def has(self, key: str) -> bool:
        return self.prefix + key in self.sd

    def put(self, ours: str, tensor: torch.Tensor):
        self.out[ours] = tensor.contiguous()

    def linear(self, ours: str, theirs: str, bias=True, transpose=False):
        w = self.take(theirs + ".weight")
        self.put(ours + ".weight", w.t() if transpose else w)
        if bias:
            self.put(ours + ".bias", self.take(theirs + ".bias"))

    def fused(self, ours: str, parts: list[str], bias=True):
        self.put(ours + ".weight", torch.cat([self.take(p + ".weight") for p in parts]))
        if bias:
            self.put(ours + ".bias", torch.cat([self.take(p + ".bias") for p in parts]))

    def norm(self, ours: str, theirs: str, bias=True):
        self.linear(ours, theirs, bias=bias)

    def output_head(self, cfg, name: str = "lm_head.weight") -> dict:
        """The language-model output layer, which sits beside the base model: its weight unless
        tied to the embeddings, its bias where the config has one (its own even when tied).
        Returns the mapped state."""
        self.prefix = ""
        if not cfg.tie_embeddings:
            self.put("lm_head.weight", self.take(name))
        if cfg.lm_head_bias:
            self.put("lm_head.bias", self.take("lm_head.bias"))
        return self.out
