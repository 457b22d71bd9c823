"""GGUF files (llama.cpp: the bundled SmolLM2 and Gemma 3, a user's file): metadata and
dequantised tensors in transformers' names, handed to the family of the file's architecture, and
the file's tokenizer as a cached fast tokenizer.

`read_gguf` returns an HF config plus a float32 state dict whose names and shapes are exactly
those of the matching transformers model, so every later step (our modules, parity tests against
transformers) works on one familiar layout. The llama family reads its files itself (its GGUF
half); every other architecture transformers reads (mistral, qwen2, qwen3, qwen3_moe, gemma2,
gemma3, phi3, falcon, bloom, gpt2...) goes through transformers' own GGUF conversion
(`load_gguf_checkpoint`), which knows llama.cpp's renames and row orders, rather than a second
copy of them here. Quantised blocks are dequantised with `gguf.quants.dequantize`. The `gguf`
and `transformers` packages are imported when first needed.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from attnviz.base.limits import LIMITS
from attnviz.weights.families import gguf_family, hf_family
from attnviz.weights.folders import existing_file, size_text

log = logging.getLogger(__name__)


def field(reader, key: str, default=None):
    """One metadata field of an open `GGUFReader` (its Python value), or `default`."""
    found = reader.get_field(key)
    return default if found is None else found.contents()


def read_gguf(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """Read a GGUF into (HF config dict, float32 HF state dict).

    For llama: the config works as `LlamaConfig(**cfg)`; the keys are those of
    `LlamaForCausalLM(LlamaConfig(**cfg)).state_dict()`, except that `lm_head.weight` is left out
    when `cfg["tie_word_embeddings"]` is true (the GGUF has no `output.weight`): each weight is
    stored once. Q and K rows are un-permuted to HF's layout.
    """
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    path = existing_file(path, ".gguf")
    started = time.perf_counter()
    reader = GGUFReader(path)
    check_gguf_size(reader, path)
    family = gguf_family(field(reader, "general.architecture"))
    if family is None:
        return _read_with_transformers(path)
    names = [t.name for t in reader.tensors]
    cfg = family.gguf_config(lambda key, default=None: field(reader, key, default),
                             has_output_weight="output.weight" in names)
    state: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        hf_name = family.gguf_name(tensor.name)
        array = dequantize(tensor.data, tensor.tensor_type)
        if tensor.tensor_type != GGMLQuantizationType.F32 or not array.flags.writeable:
            # Own float32 copy: F32 tensors come back as read-only views of the memory map.
            array = array.astype(np.float32)
        weight = torch.from_numpy(array)  # (rows, cols) = HF (out_features, in_features)
        state[hf_name] = family.gguf_tensor(hf_name, weight, cfg).contiguous()

    expected = family.hf_shapes(cfg)
    if set(state) != set(expected):
        missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        raise ValueError(f"GGUF tensors do not match the config: missing {missing[:5]}, "
                         f"unexpected {extra[:5]}; the file may be truncated or not {family.NAME}.")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise ValueError(f"GGUF tensor for {name} has shape {tuple(state[name].shape)}, "
                             f"expected {shape} from the metadata; the file is inconsistent.")
    log.debug("read_gguf(%s): %d tensors in %.2f s", path.name, len(state), time.perf_counter() - started)
    return cfg, state


def _cache_marker(gguf_path: Path) -> str:
    # Name and byte size identify the bundled file well enough to notice a swapped model.
    return f"{gguf_path.name}\n{gguf_path.stat().st_size}\n"


def gguf_tokenizer(path: str | Path, cache_dir: Path):
    """Fast tokenizer (with chat template) of a GGUF file, cached in `cache_dir`.

    The first call builds it from the GGUF metadata (transformers, ~3-5 s) and saves it with
    `save_pretrained` into `cache_dir` (a folder used for this tokenizer only); later calls
    load it from there without opening the GGUF. The cache is rebuilt when the GGUF's name or
    size differ from the ones recorded in `cache_dir/gguf_source.txt`.
    """
    from transformers import AutoTokenizer

    path = existing_file(path, ".gguf")
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


def quantization(path: str | Path) -> str:
    """The tensor types a GGUF file holds, most weights first: "Q4_K 62%, Q5_0 25%, F32 13%"."""
    from gguf import GGUFReader
    reader = GGUFReader(existing_file(path, ".gguf"))
    counts: dict[str, int] = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + int(t.n_elements)
    total = max(1, sum(counts.values()))
    return ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def check_gguf_size(reader, path: Path) -> None:
    """Refuse a file whose float32 weights would pass the loader's bound, before dequantising."""
    n = sum(int(t.n_elements) for t in reader.tensors)
    if 4 * n > LIMITS.max_weight_bytes:
        raise ValueError(f"{path.name} holds {n:,} weights: {size_text(4 * n)} as float32, over the "
                         f"{size_text(LIMITS.max_weight_bytes)} this server loads (ATTNVIZ_MAX_WEIGHT_BYTES)")


def _read_with_transformers(path: Path):
    """(transformers config, float32 HF state dict) through transformers' GGUF conversion: its
    config mapping, then its tensor renames into an empty (meta) model's names."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES, load_gguf_checkpoint

    try:
        meta = load_gguf_checkpoint(str(path), return_tensors=False)
    except ValueError as err:
        raise ValueError(f"{path.name}: {err} Readable GGUF architectures: "
                         f"{', '.join(GGUF_SUPPORTED_ARCHITECTURES)}.") from None
    hf_cfg = dict(meta["config"])
    model_type = hf_cfg.pop("model_type")
    hf_family(model_type, ("lm",))                 # a family we run, or ValueError naming those we do
    config = AutoConfig.for_model(model_type, **hf_cfg)
    with torch.device("meta"):
        empty = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=empty)["tensors"]
    state = {k: v.float().contiguous() for k, v in tensors.items()}
    expected = {k for k in empty.state_dict() if not (config.tie_word_embeddings and k == "lm_head.weight")}
    missing = sorted(expected - set(state))
    if missing:
        raise ValueError(f"{path.name} lacks tensors its config implies, e.g. {missing[:3]}; the file may be "
                         "truncated or of another architecture")
    return config, state
