"""Quantization measured here: int8 dynamic quantization of the linear layers (torch's own,
`torch.ao.quantization.quantize_dynamic`) and bf16 linear layers (where this CPU has bf16), as a
NEW model (the shared one is never touched); for each bundled model its latency ratio and fidelity
against float32: KL and top-1 agreement (language model), embedding cosine (MiniLM), saliency IoU
and CLS cosine (DINOv2), identical translations (en-pt / pt-en). And the seed's experiment:
attention probabilities stored in 8 bits under softmax and under the ReLU variant.

`python -m attnviz.latency.quantize [--models minilm,smollm2,...] [--rounds 5]` prints the table;
`--sensitivity smollm2` which kinds of linear layer int8 hurts (each left float32 in turn).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import warnings
import sys

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F

from attnviz.base.timing import measure
from attnviz.core.blocks import ACTIVATIONS
from attnviz.core.transformer import sentence_embedding
from attnviz.weights.catalogue import load_model

MODES = ("int8", "bf16")
TEXT = "The quick brown fox jumps over the lazy dog because it was late for a meeting with the wise old owl."
SENTENCES = ["The weather is nice today.", "I would like a cup of coffee, please.",
             "Where is the train station?"]


def has_bf16() -> bool:
    """bf16 matrix products in hardware (AVX512-BF16 / AMX on x86, BF16 on Arm): else bf16 is emulated."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return any(f in flags for f in ("avx512_bf16", "amx_bf16", " bf16"))


class QuantLinear(nn.Module):
    """A linear layer run by torch's dynamic int8 (or a bf16 copy), keeping our Linear's `act`. Its
    `weight` and `bias` can be read either way (int8: the dequantized weight, the float bias), so code that
    reads a layer's weights rather than calling it (a translator's shortlisted output layer, a logit
    lens) sees the numbers the quantized layer computes with."""

    def __init__(self, linear: nn.Linear, mode: str):
        super().__init__()
        self.mode = mode
        self.in_features, self.out_features = linear.in_features, linear.out_features
        if mode == "int8":
            plain = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
            plain.load_state_dict({k: v.detach().float() for k, v in linear.state_dict().items()})
            # per output channel: one scale per row keeps outlier rows from crushing the rest (per-tensor
            # int8 gave SmolLM2 a top-1 agreement of 36% here, per-channel far more)
            spec = {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
            self.inner = torch.ao.quantization.quantize_dynamic(nn.Sequential(plain), spec, dtype=torch.qint8)[0]
            self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        else:
            self.weight = nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)
            self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(torch.bfloat16),
                                                                      requires_grad=False)

    def __getattr__(self, name: str):
        if name == "weight" and self.__dict__.get("mode") == "int8":  # the int8 weight, dequantized
            return self._modules["inner"].weight().dequantize()
        return super().__getattr__(name)

    def forward(self, x, act: str = "none"):
        if self.mode == "int8":
            y = self.inner(x.float())
        else:
            y = F.linear(x.to(torch.bfloat16), self.weight, self.bias).float()
        return y if act == "none" else ACTIVATIONS[act](y)


def linear_weights(net: nn.Module) -> dict[str, int]:
    """Weights per kind of linear layer in `net`, by the name its layers go by (qkv, out, fc_in,
    fc_out, lm_head, ...)."""
    out: dict[str, int] = {}
    for module in net.modules():
        for name, child in module.named_children():
            if isinstance(child, nn.Linear) and child.weight.numel():
                out[name] = out.get(name, 0) + child.weight.numel()
    return out


def linear_kinds(net: nn.Module) -> list[str]:
    """The names linear layers go by in `net`: one per kind."""
    return sorted(linear_weights(net))


def quantize_net(net: nn.Module, mode: str, keep=()) -> nn.Module:
    """A deep copy of `net` with every linear layer (nn.Linear and its subclasses) replaced, except
    the kinds named in `keep` (see `linear_kinds`), which stay float32."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    kinds = linear_kinds(net)
    unknown = set(keep) - set(kinds)
    if unknown:
        raise ValueError(f"no linear layers named {sorted(unknown)}; this model has {', '.join(kinds)}")
    # prepacked weights (Linear.pack: oneDNN's, the float16 grid's) cannot be deep-copied: the
    # copies start unpacked
    memo = {id(getattr(m, name)): None for m in net.modules() for name in ("_packed", "_half")
            if getattr(m, name, None) is not None}
    out = copy.deepcopy(net, memo)
    warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated")  # torch 2.13 still runs it
    for name, module in list(out.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and child.weight.numel() and child_name not in keep:
                setattr(module, child_name, QuantLinear(child, mode))
    return out.eval()


def quantized_copy(model, mode: str = "int8", keep=()):
    """A NEW model whose linear layers are int8 (dynamic) or bf16, but the kinds in `keep`; `model`
    is untouched."""
    twin = copy.copy(model)
    twin.net = quantize_net(model.net, mode, keep)
    kept = f", {'+'.join(sorted(keep))} float32" if keep else ""
    twin.info = dataclasses.replace(model.info, key=f"{model.info.key} ({mode}{kept})")
    return twin


def _forward(model):
    if hasattr(model, "translate"):
        return lambda: model.translate(SENTENCES[0], attentions=False)
    inp = model.inputs(_input(model))
    kw = {k: inp[k] for k in ("input_ids", "pixel_values") if inp.get(k) is not None}
    return lambda: model.net(**kw, logits=True)


def _input(model):
    if model.cfg.is_vision:
        return torch.rand(3, model.image_size, model.image_size, generator=torch.Generator().manual_seed(0))
    if getattr(model, "tokenizer", None) is None:  # a synthetic or toy model: token ids
        return [i % model.cfg.vocab_size for i in range(24)]
    return TEXT


def latency_ratio(model, twin, rounds: int = 5) -> float:
    """median(twin) / median(model), one call of each in turn per round (a busy host's drift shared)."""
    a, b = _forward(model), _forward(twin)
    ta, tb = [], []
    with torch.inference_mode():
        a(), b()
        for _ in range(rounds):
            ta.append(measure(a, 1, 0).median)
            tb.append(measure(b, 1, 0).median)
    return float(torch.tensor(tb).median() / torch.tensor(ta).median())


def reference(model):
    """The float model's output that `fidelity` compares a quantized twin with."""
    if hasattr(model, "translate"):
        return [model.translate(s, attentions=False).text for s in SENTENCES]
    return model.trace(_input(model), attentions=False)


def fidelity(model, twin, ref=None) -> dict:
    """What the quantized twin keeps of the float model's output (see the module docstring);
    `ref`: the model's `reference`, when several twins are compared with it."""
    ref = reference(model) if ref is None else ref
    if hasattr(model, "translate"):
        same = [text == twin.translate(s, attentions=False).text for s, text in zip(SENTENCES, ref)]
        return {"translations identical": f"{sum(same)}/{len(same)}"}
    got = twin.trace(_input(model), attentions=False)
    if ref.logits is not None:
        p, q = ref.logits.float().log_softmax(-1), got.logits.float().log_softmax(-1)
        kl = float((p.exp() * (p - q)).sum(-1).mean())
        top1 = float((p.argmax(-1) == q.argmax(-1)).float().mean())
        return {"KL (nats/token)": kl, "top-1 agreement": top1}
    if ref.saliency is not None:
        a, b = ref.saliency >= ref.saliency.quantile(0.8), got.saliency >= got.saliency.quantile(0.8)
        iou = float((a & b).sum() / (a | b).sum().clamp(min=1))
        return {"saliency IoU (top 20%)": iou, "CLS cosine": float(F.cosine_similarity(ref.hidden[0], got.hidden[0], 0))}
    e1, e2 = (sentence_embedding(t.hidden[None])[0] for t in (ref, got))
    return {"embedding cosine": float(F.cosine_similarity(e1, e2, 0))}


def quantization_table(keys=("minilm", "smollm2", "dinov2", "en-pt", "pt-en"), modes=None, rounds: int = 5,
                       loader=load_model, check=None) -> pd.DataFrame:
    """One row per (model, mode): latency ratio (quantized / float32, below 1 faster) and fidelity.
    `check` (e.g. a Cancel's) runs before each model is loaded and each copy is made, and raises to
    stop; one copy exists at a time, so a stop frees its memory with it."""
    modes = list(modes or (["int8", "bf16"] if has_bf16() else ["int8"]))
    rows = []
    for key in keys:
        if check is not None:
            check()
        model = loader(key)
        ref = reference(model)
        for mode in modes:
            if check is not None:
                check()
            twin = quantized_copy(model, mode)
            rows.append(dict(model=key, mode=mode, latency_ratio=latency_ratio(model, twin, rounds),
                             **fidelity(model, twin, ref)))
    return pd.DataFrame(rows)


def sensitivity(model, mode: str = "int8", check=None) -> pd.DataFrame:
    """Which layers the quantization hurts: the fidelity with every linear layer quantized, then with
    each kind of linear layer (qkv, out, fc_in, fc_out, lm_head, ...) left float32 in turn, and the
    share of the linear weights that stay float32 (its memory price). `check` (e.g. a Cancel's)
    runs before each copy is made and raises to stop; one copy exists at a time."""
    sizes = linear_weights(model.net)
    kinds, ref = sorted(sizes), reference(model)
    rows = []
    for keep in [()] + [(k,) for k in kinds]:
        if check is not None:
            check()
        twin = quantized_copy(model, mode, keep)
        rows.append(dict(float32_kept=keep[0] if keep else "none",
                         float32_weight_share=sum(sizes[k] for k in keep) / sum(sizes.values()),
                         **fidelity(model, twin, ref)))
    return pd.DataFrame(rows)


def probabilities_int8(model, text: str = TEXT, variants=("softmax", "relu")) -> pd.DataFrame:
    """The seed's experiment: each variant's attention probabilities stored as 8-bit codes
    (p -> round(p x 255) / 255, the fixed scale int8 runtimes give values in [0, 1]). Per variant:
    the share of non-zero weights flushed to 0, the probability mass they held, and the mean L1
    error per row (out of 2). Softmax spreads tiny weights over every key, which 8 bits flush;
    ReLU's zeros are exact, so less is lost."""
    rows = []
    for v in variants:
        att = model.trace(text, variants="fused" if v == "softmax" else v).attentions.float()  # [L, H, n, n]
        q = torch.round(att * 255) / 255
        nonzero = att > 0
        flushed = nonzero & (q == 0)
        rows.append(dict(variant=v, flushed_share=float(flushed.sum() / nonzero.sum().clamp(min=1)),
                         mass_lost=float((att * flushed).sum(-1).mean()),
                         l1_per_row=float((att - q).abs().sum(-1).mean())))
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnviz.latency.quantize", description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="minilm,smollm2,dinov2,en-pt,pt-en")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sensitivity", metavar="MODEL", help="instead: which linear layers int8 hurts in MODEL "
                    "(its fidelity with each kind left float32 in turn)")
    args = ap.parse_args(argv)
    if args.sensitivity:
        try:
            sys.stdout.write(sensitivity(load_model(args.sensitivity)).to_string(index=False) + "\n")
        except ValueError as err:
            ap.error(str(err))
        return 0
    try:
        table = quantization_table([k.strip() for k in args.models.split(",") if k.strip()], rounds=args.rounds)
    except ValueError as err:
        ap.error(str(err))
    sys.stdout.write(table.to_string(index=False) + "\n\n")
    sys.stdout.write(probabilities_int8(load_model("minilm")).to_string(index=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
