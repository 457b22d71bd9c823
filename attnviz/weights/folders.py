"""Local Hugging Face model folders: the allow-list, the budgets, and every check made before a
file is opened or a tensor allocated.

Every file of a folder is checked before it is opened: a regular file (not /dev/zero, a FIFO or a
folder behind a symlink) no bigger than its budget. Config values are bounded (by the family's
`size`, through `Bounds`) and the implied parameter count is checked against the weight budget
before anything is allocated. Every failure is a ValueError that names the folder only as the
caller gave it (`name`), never where it resolves. Nothing is ever unpickled: safetensors, or
`torch.load(weights_only=True)`.
"""
from __future__ import annotations

import json
import math
import os
import pickle  # only for its error type; nothing is unpickled
import stat
from pathlib import Path

import torch

from attnviz.base.limits import LIMITS
from attnviz.core.config import TASKS, Config
from attnviz.core.model import Model
from attnviz.core.transformer import Transformer
from attnviz.core.translator import Seq2SeqModel
from attnviz.weights.families import convert, family, hf_family
from attnviz.weights.mapper import get

SMALL_JSON = ("config.json", "preprocessor_config.json", "tokenizer_config.json", "special_tokens_map.json",
              "generation_config.json", "added_tokens.json", "chat_template.json")
# opus-mt's tokenizer: a SentencePiece model per side and one vocabulary (transformers' MarianTokenizer)
TWO_SIDED_TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model",
                   "spiece.model", "sentencepiece.bpe.model", "chat_template.jinja", "source.spm", "target.spm",
                   "target_vocab.json")
MAX_TOKENIZER_BYTES = 64 * 2**20   # one tokenizer file (vocabularies of large models are ~10-20 MB)
MAX_FOLDER_ENTRIES = 10_000        # a model folder has a handful of files; more is refused
FOLDER_TASKS = (*TASKS, "translation")  # what a local HF folder may hold (Whisper comes as CTranslate2)


def existing_file(path: str | Path, suffix: str) -> Path:
    """`path` if it is a file with this suffix; ValueError saying what to pass otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} does not exist; pass the path of a {suffix} file.")
    if path.suffix.lower() != suffix:
        raise ValueError(f"{path} is not a {suffix} file; pass the path of a {suffix} file.")
    return path


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


class Folder:
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
            raise self.fail(f"{file} is {size_text(st.st_size)}, over the {size_text(budget)} limit ({budget_name})")
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
            raise self.fail(f"{file} is over the {size_text(budget)} limit ({budget_name})")
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

    def weight_files(self, entries: dict) -> list[str]:
        """The weight files to read (safetensors first), each a regular file, all within the budget."""
        names = sorted(n for n in entries if n.endswith(".safetensors"))
        if not names:
            names = sorted(n for n in entries if n.startswith("pytorch_model") and n.endswith(".bin"))
        budget = self.limits.max_weight_bytes
        total = sum(self.check_file(n, entries[n], budget, "ATTNVIZ_MAX_WEIGHT_BYTES") for n in names)
        if total > budget:
            raise self.fail(f"its weight files hold {size_text(total)}, over the {size_text(budget)} limit "
                            "(ATTNVIZ_MAX_WEIGHT_BYTES)")
        return names

    def read_state(self, names: list[str]) -> dict[str, torch.Tensor]:
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        if not names:
            raise self.fail("has no weights: expected model.safetensors (or pytorch_model.bin)")
        state = {}
        try:
            for f in names:
                path = str(self.path / f)
                if f.endswith(".safetensors"):
                    state.update(load_file(path))
                else:  # weights_only: tensors and plain containers, never arbitrary objects
                    loaded = torch.load(path, map_location="cpu", weights_only=True)
                    if not isinstance(loaded, dict):
                        raise ValueError("not a state dict")
                    state.update(loaded)
        except OSError as err:  # its message names the resolved file: only the reason is kept
            raise self.fail(f"the weight files are unreadable ({err.strerror or type(err).__name__})") from None
        except (SafetensorError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as err:
            # weights_only=True refuses anything but tensors: a file that smuggles code lands here too
            reason = str(err)[:200].replace(str(self.path), self.name)
            raise self.fail(f"the weight files are corrupt or unreadable ({reason})") from None
        if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
            raise self.fail("the weight files are corrupt or unreadable (not a mapping of names to tensors)")
        return state


class Bounds:
    """Bounded reads of a folder's config values for a family's `size` (far above any supported
    checkpoint; they stop absurd values before any loop or allocation sized by them)."""
    MAX_LAYERS, MAX_HEADS, MAX_D_MODEL, MAX_D_HEAD, MAX_D_FF = 512, 1024, 65_536, 4_096, 1 << 19
    MAX_VOCAB, MAX_POSITIONS, MAX_TYPE_VOCAB, MAX_IMAGE_SIDE, MAX_CHANNELS = 1 << 22, 1 << 24, 1024, 8192, 16

    def __init__(self, folder: Folder, hf):
        self.folder, self.hf = folder, hf

    def fail(self, what: str) -> ValueError:
        return self.folder.fail(what)

    def int(self, key: str, lo: int, hi: int, default=None, optional=False) -> int | None:
        value = get(self.hf, key, default)
        if value is None and optional:
            return None
        if type(value) is not int or not lo <= value <= hi:
            raise self.fail(f"config.json: {key} must be a whole number in {lo:,}..{hi:,}, got {value!r:.40}")
        return value

    def number(self, key: str, lo: float, hi: float, default) -> float:
        """A number in (lo, hi]."""
        value = get(self.hf, key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo < value <= hi:
            raise self.fail(f"config.json: {key} must be a number in ({lo:g}, {hi:g}], got {value!r:.40}")
        return value

    def width(self, key, **kw):
        return self.int(key, 1, self.MAX_D_MODEL, **kw)

    def heads(self, key, **kw):
        return self.int(key, 1, self.MAX_HEADS, **kw)

    def layers(self, key, **kw):
        return self.int(key, 1, self.MAX_LAYERS, **kw)

    def ff(self, key, **kw):
        return self.int(key, 1, self.MAX_D_FF, **kw)

    def vocab(self, key, **kw):
        return self.int(key, 1, self.MAX_VOCAB, **kw)

    def positions(self, key, **kw):
        return self.int(key, 1, self.MAX_POSITIONS, **kw)

    def blocks(self, L: int, d: int, h: int, kv: int, dh: int | None, ff: int, gated: bool) -> int:
        """Parameters of L blocks (attention and MLP weights); the head width checked."""
        if dh is None:
            if d % h:
                raise self.fail(f"config.json: the width ({d}) must be a multiple of the number of heads ({h})")
            dh = d // h
            if dh > self.MAX_D_HEAD:
                raise self.fail(f"config.json: heads of width {dh} are over the {self.MAX_D_HEAD} this loader reads")
        attention = d * (h + 2 * kv) * dh + h * dh * d
        return L * (attention + (3 if gated else 2) * d * ff)


def check_size(folder: Folder, hf, name: str) -> int:
    """Bound every size the family reads from the config; refuse what would not fit the budget."""
    params = hf_family(name, FOLDER_TASKS).size(hf, Bounds(folder, hf))
    budget = folder.limits.max_weight_bytes
    if 4 * params > budget:
        raise folder.fail(f"its config describes about {params / 1e9:.2f} G parameters ({size_text(4 * params)} "
                          f"as float32), over the {size_text(budget)} limit (ATTNVIZ_MAX_WEIGHT_BYTES)")
    return params


def load_dir(folder: str | Path, key: str | None = None, source: str | None = None, *,
             name: str | None = None, limits=None, **info) -> Model | Seq2SeqModel:
    """A local Hugging Face model folder. `name`: how messages and the model's key call the folder
    (default: `folder` as given); `limits`: the budgets (default: `LIMITS`). Any failure is a
    ValueError whose message names the folder only as `name`."""
    name = str(folder) if name is None else name
    limits = limits or LIMITS
    given = str(folder)
    try:
        return _load(Folder(Path(folder).expanduser(), name, limits), key, source, info)
    except ValueError as err:  # a resolved path never leaks through a message
        message = str(err)
        if given != name and os.sep in given:
            message = message.replace(given, name)
        raise ValueError(message) from None
    except Exception as err:  # anything a third-party reader raises on a hostile folder
        raise ValueError(f"{name!r} could not be loaded as a model ({type(err).__name__})") from None


def _load(folder: Folder, key, source, info) -> Model | Seq2SeqModel:
    if not folder.path.is_dir():
        raise ValueError(f"{folder.name!r} is not a folder; give a bundled model key (attnviz.list_models()) "
                         "or a local Hugging Face model folder")
    entries = folder.entries()
    if "config.json" not in entries:
        raise folder.fail("has no config.json; point to a Hugging Face model folder "
                          "(config.json + model.safetensors)")
    hf_cfg = folder.read_json("config.json")
    kind = hf_cfg.get("model_type")
    fam = hf_family(kind, FOLDER_TASKS)
    for file in SMALL_JSON + TOKENIZER_FILES:  # everything transformers may open, before it does
        if file in entries:
            if file in SMALL_JSON:
                folder.check_file(file, entries[file], folder.limits.max_config_bytes, "ATTNVIZ_MAX_CONFIG_BYTES")
            else:
                folder.check_file(file, entries[file], MAX_TOKENIZER_BYTES,
                                  "attnviz.weights.folders.MAX_TOKENIZER_BYTES")
    from transformers import CONFIG_MAPPING
    try:  # from the dict already read and checked: transformers opens no file here
        hf_config = CONFIG_MAPPING[kind].from_dict(hf_cfg)
    except Exception as err:
        raise folder.fail(f"config.json has values transformers refuses ({str(err)[:200]})") from None
    check_size(folder, hf_config, kind)
    if fam.TASK == "translation":  # opus-mt (marian), BART: an encoder-decoder for the Translate page
        return _load_translator(folder, entries, hf_config, fam, key, source, info)
    if hasattr(fam, "build"):  # a model of two parts (CLIP, SigLIP: a vision and a text tower)
        return _load_built(folder, entries, hf_config, fam, key, source, info)
    cfg, state = convert(hf_config, folder.read_state(folder.weight_files(entries)))
    net = Transformer.from_state(cfg, state)
    tokenizer = None
    if not cfg.is_vision and any(f in entries for f in ("tokenizer.json", "vocab.txt", "vocab.json",
                                                         "tokenizer.model")):
        from transformers import AutoTokenizer
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder.path), local_files_only=True)
        except Exception as err:
            raise folder.fail(f"its tokenizer files could not be read ({type(err).__name__})") from None
    mean, std, size = image_settings(folder, entries, cfg)
    about = Model.describe(key or folder.name, cfg, source or f"local folder {folder.name}", net, **info)
    return Model(net, about, tokenizer, image_mean=mean, image_std=std, image_size=size,
                 features=audio_features(folder, entries, cfg))


def _tokenizer(folder: Folder, entries: dict):
    if not any(f in entries for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(str(folder.path), local_files_only=True)
    except Exception as err:
        raise folder.fail(f"its tokenizer files could not be read ({type(err).__name__})") from None


def _load_built(folder: Folder, entries: dict, hf_config, fam, key, source, info):
    """A family that builds its own model around its vision tower (`build`), with the folder's
    tokenizer and image settings."""
    state = folder.read_state(folder.weight_files(entries))
    cfg, *parts = fam.config(hf_config, state)
    mean, std, size = image_settings(folder, entries, cfg)
    return fam.build(cfg, *parts, state, key or folder.name, source or f"local folder {folder.name}",
                     _tokenizer(folder, entries), image_mean=mean, image_std=std, image_size=size)


def _load_translator(folder: Folder, entries: dict, hf_config, fam, key, source, info) -> Seq2SeqModel:
    state = folder.read_state(folder.weight_files(entries))
    cfg = fam.config(hf_config, state)
    tokenizer = None
    if any(f in entries for f in TOKENIZER_FILES):
        from transformers import AutoTokenizer
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder.path), local_files_only=True)
        except Exception as err:
            raise folder.fail(f"its tokenizer files could not be read ({type(err).__name__})") from None
    return Seq2SeqModel.build(cfg, fam.weights(cfg, state), key or folder.name,
                              source or f"local folder {folder.name}", tokenizer, **info)


def audio_features(folder: Folder, entries: dict, cfg: Config):
    """An audio folder's feature extractor (transformers'), from preprocessor_config.json when it has one."""
    if not cfg.is_audio:
        return None
    settings = folder.read_json("preprocessor_config.json") if "preprocessor_config.json" in entries else None
    try:
        features = family(cfg.family).feature_extractor(settings)
    except Exception as err:
        raise folder.fail(f"preprocessor_config.json has values transformers refuses ({str(err)[:200]})") from None
    if getattr(features, "sampling_rate", None) != 16_000 or getattr(features, "feature_size", None) != 1:
        raise folder.fail("preprocessor_config.json: the model must hear 16 kHz mono samples "
                          "(sampling_rate 16000, feature_size 1)")
    return features


def image_settings(folder: Folder, entries: dict, cfg: Config):
    """(mean, std, input side) of a vision folder, from preprocessor_config.json when it has one."""
    if not cfg.is_vision:
        return None, None, 0
    default = family(cfg.family).image_defaults(cfg)  # (mean, std, side) without a preprocessor config
    if "preprocessor_config.json" not in entries:
        return default
    p = folder.read_json("preprocessor_config.json")
    size = p.get("crop_size") or p.get("size") or {}
    side = size.get("height") or size.get("shortest_edge") if isinstance(size, dict) else size
    side = side or cfg.image_size
    if type(side) is not int or not 1 <= side <= Bounds.MAX_IMAGE_SIDE:
        raise folder.fail(f"preprocessor_config.json: the image size must be a whole number in "
                          f"1..{Bounds.MAX_IMAGE_SIDE}, got {side!r:.40}")
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
