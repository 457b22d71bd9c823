"""The decoder / encoder / vision model: `Model` (a `BaseModel` with its tokenizer or image settings)
and its `Trace`."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from attnviz.base.limits import LIMITS
from attnviz.core import surgery
from attnviz.core.attention import parse_variant
from attnviz.core.audio_frames import frame_count, min_samples
from attnviz.core.base_model import BaseModel, ModelInfo
from attnviz.core.config import Config
from attnviz.core.pixels import preprocess
from attnviz.core.tokens import labels as token_labels
from attnviz.core.transformer import Transformer
from attnviz.uploads.audio import RATE, Audio, read_audio

MAX_IMAGE_SIDE = 1036     # 74 DINOv2 patches: 5,477 tokens, about the most a trace should hold


@dataclass
class Trace:
    tokens: list[str]
    attentions: torch.Tensor | None      # [L, H, n, n] post-softmax (captured layers only; see `layers`)
    hidden: torch.Tensor                 # [n, d_model], last_hidden_state
    logits: torch.Tensor | None          # [n, vocab] for language models
    ids: torch.Tensor | None = None      # [n] token ids (text)
    special: torch.Tensor | None = None  # [n] bool, special tokens (CLS, SEP, image CLS, registers)
    layers: list[int] = field(default_factory=list)  # which layers `attentions` holds, in order
    truncated: int = 0                   # tokens dropped to fit the model's positions
    grid: tuple[int, int] | None = None  # vision: patches per side (rows, cols)
    seconds_per_token: float = 0.0       # audio: each token is a frame this long (0: not audio)
    n_prefix: int = 0                    # vision: tokens before the patches (CLS + registers)
    saliency: torch.Tensor | None = None  # [H, W] in [0, 1] when the model has a saliency decoder
    states: list[torch.Tensor] | None = None  # [n, d] input of each block, then the final hidden

    @property
    def n(self) -> int:
        return len(self.tokens)


class Model(BaseModel):
    """A transformer of ours (`Transformer`: decoder, encoder or vision) plus what turns user input
    into its input. `features`: an audio model's feature extractor (transformers' Wav2Vec2FeatureExtractor:
    samples -> the normalised input values), as the tokenizer is a text model's."""

    def __init__(self, net: Transformer, info: ModelInfo, tokenizer=None, *, image_mean=None,
                 image_std=None, image_size: int = 0, decoder=None, kept: torch.Tensor | None = None,
                 features=None):
        super().__init__(net, info)
        self.tokenizer = tokenizer
        self.features = features
        self.image_mean = image_mean or (0.5, 0.5, 0.5)
        self.image_std = image_std or (0.5, 0.5, 0.5)
        self.image_size = image_size or net.cfg.image_size
        self.decoder = decoder.eval() if decoder is not None else None
        cfg = net.cfg
        self.kept = kept if kept is not None else torch.ones(cfg.n_layers, cfg.n_heads, dtype=torch.bool)

    @property
    def cfg(self) -> Config:
        return self.net.cfg

    @classmethod
    def shape(cls, cfg: Config) -> dict:
        return dict(n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                    max_positions=cfg.max_positions)

    @property
    def has_tokenizer(self) -> bool:
        return self.tokenizer is not None

    @property
    def kind(self) -> str:
        return "vision" if self.cfg.is_vision else "audio" if self.cfg.is_audio else \
            "lm" if self.next_token else "encoder"

    @property
    def next_token(self) -> bool:
        return self.net.lm_head is not None and self.cfg.task == "lm"

    @property
    def id_limit(self) -> int:
        return self.max_tokens

    def parts(self) -> tuple:
        return (self.net, self.decoder)

    def __repr__(self):
        c = self.cfg
        return f"Model({self.info.key!r}, {c.family}, {c.n_layers} layers x {c.n_heads} heads)"

    @property
    def max_tokens(self) -> int:
        return self.cfg.max_positions

    # ---------------------------------------------------------------- input
    def encode_text(self, text: str) -> tuple[torch.Tensor, int]:
        """Token ids [n] (special tokens as the reference adds them) and how many were truncated."""
        self.check_text(text)
        if not getattr(self.tokenizer, "is_fast", False):  # the toys' few-symbol tokenizer
            ids = self.tokenizer(text)["input_ids"]
            dropped = max(0, len(ids) - self.max_tokens)
            if dropped:
                ids = self.tokenizer(text, truncation=True, max_length=self.max_tokens)["input_ids"]
            return torch.tensor(ids, dtype=torch.long), dropped
        # Tokenized once: the first window is what `truncation=True` gives; the rest (each with the
        # same special tokens around it) counts what was dropped.
        windows = self.tokenizer(text, truncation=True, max_length=self.max_tokens,
                                 return_overflowing_tokens=True)["input_ids"]
        special = self.tokenizer.num_special_tokens_to_add()
        dropped = sum(len(w) - special for w in windows[1:])
        return torch.tensor(windows[0], dtype=torch.long), dropped

    def pixels(self, image, size: int | None = None) -> torch.Tensor:
        """A PIL image -> normalised [3, size, size]; a float tensor [3, H, W] is checked and kept."""
        p = self.cfg.patch_size
        if isinstance(image, torch.Tensor):
            if image.dim() != 3 or image.shape[0] != self.cfg.n_channels or not image.is_floating_point():
                raise ValueError(f"an image tensor must be float [{self.cfg.n_channels}, H, W]; "
                                 f"got {tuple(image.shape)} {image.dtype}")
            if image.shape[1] % p or image.shape[2] % p or min(image.shape[1:]) < p:
                raise ValueError(f"image height and width must be multiples of the patch size {p}; "
                                 f"got {tuple(image.shape[1:])}")
            return image.float()
        if not hasattr(image, "convert"):
            raise ValueError("give a PIL image, a float tensor [3, H, W], or bytes through attnviz.open_image")
        return preprocess(image, size or self.image_size, mean=self.image_mean, std=self.image_std,
                          patch_size=p, min_size=p, max_size=MAX_IMAGE_SIDE)

    def audio_values(self, x) -> torch.Tensor:
        """Audio -> the input values [n] the convolutions read: WAV / FLAC bytes, an `Audio` or an
        array of 16 kHz samples through the feature extractor; a float tensor [n] as given (values
        already normalised, as the feature extractor writes them)."""
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            if x.dim() != 1:
                raise ValueError(f"audio input values must be a float tensor [n_samples]; got {tuple(x.shape)}")
            return x.float()
        if isinstance(x, (str, list)) or hasattr(x, "convert"):
            raise ValueError(f"model {self.info.key!r} takes audio (WAV / FLAC bytes or 16 kHz samples), "
                             "not text or images")
        if self.features is None:
            raise ValueError(f"model {self.info.key!r} has no feature extractor (preprocessor_config.json): "
                             "give its input values as a float tensor [n_samples]")
        audio = x if isinstance(x, Audio) else read_audio(x, max_seconds=LIMITS.max_audio_seconds)
        values = self.features(audio.samples, sampling_rate=RATE, return_tensors="np")["input_values"][0]
        return torch.from_numpy(values).float()

    def check_layers(self, layers) -> list[int]:
        L = self.cfg.n_layers
        layers = list(range(L)) if layers is None else sorted(set(int(i) for i in layers))
        if any(i < 0 or i >= L for i in layers):
            raise ValueError(f"layers must lie in 0..{L - 1}")
        return layers

    def inputs(self, x, image_size=None) -> dict:
        """What `Transformer.forward` takes, plus token labels and bookkeeping for the trace."""
        cfg = self.cfg
        if cfg.is_vision:
            if isinstance(x, (str, list)):
                raise ValueError(f"model {self.info.key!r} takes images, not text")
            px = self.pixels(x, image_size)
            gh, gw = px.shape[1] // cfg.patch_size, px.shape[2] // cfg.patch_size
            prefix = (["CLS"] * cfg.cls_token + ["DIST"] * cfg.distill_token
                      + [f"reg{i}" for i in range(cfg.n_registers)])
            toks = prefix + [f"p{r},{c}" for r in range(gh) for c in range(gw)]
            special = torch.zeros(len(toks), dtype=torch.bool)
            special[: len(prefix)] = True
            return dict(pixel_values=px[None], tokens=toks, special=special, grid=(gh, gw),
                        n_prefix=len(prefix), ids=None, truncated=0)
        if cfg.is_audio:
            values = self.audio_values(x)
            n = frame_count(cfg, len(values))
            if n < 1:
                raise ValueError(f"the audio is {len(values)} samples; model {self.info.key!r} needs at least "
                                 f"{min_samples(cfg)} ({min_samples(cfg) / RATE * 1000:.0f} ms) to make a frame")
            if n > self.max_tokens:
                raise ValueError(f"the audio makes {n:,} frames; model {self.info.key!r} reads at most "
                                 f"{self.max_tokens:,} ({self.max_tokens * cfg.hop / RATE:.0f} s): shorten it")
            step = cfg.hop / RATE
            return dict(input_values=values[None], tokens=[f"{i * step:.3f}s" for i in range(n)],
                        special=torch.zeros(n, dtype=torch.bool), ids=None, truncated=0, grid=None, n_prefix=0,
                        seconds_per_token=step)
        if hasattr(x, "convert") or (isinstance(x, torch.Tensor) and x.is_floating_point()):
            raise ValueError(f"model {self.info.key!r} takes text, not images")
        truncated = 0
        if isinstance(x, str):
            ids, truncated = self.encode_text(x)
        else:
            ids = self.check_ids(x)
        if self.tokenizer is not None:
            toks, special = token_labels(self.tokenizer, ids.tolist())
        else:
            toks, special = [str(i) for i in ids.tolist()], [False] * len(ids)
        return dict(input_ids=ids[None], tokens=toks, special=torch.tensor(special, dtype=torch.bool),
                    ids=ids, truncated=truncated, grid=None, n_prefix=0)

    # ---------------------------------------------------------------- trace
    def trace(self, x, head_mask=None, attentions: bool = True, *, layers=None, variants=None,
              states: bool = False, image_size: int | None = None, saliency: bool = True) -> Trace:
        """Run the model once and capture what was asked (the contract: README, "In Python")."""
        mask = self.check_head_mask(head_mask)
        layers = self.check_layers(layers)
        variants = _variants(variants, self.cfg.n_layers)
        inp = self.inputs(x, image_size)
        with torch.inference_mode():
            buf = None
            if attentions and all(self.net.blocks[i].attn.n_heads == self.cfg.n_heads for i in layers):
                n = len(inp["tokens"])  # weights go straight into the trace's tensor: no stacking copy
                dtype = next(self.net.parameters()).dtype
                buf = torch.empty(len(layers), self.cfg.n_heads, n, n, dtype=dtype)
            out = self.net(input_ids=inp.get("input_ids"), pixel_values=inp.get("pixel_values"),
                           input_values=inp.get("input_values"), head_mask=mask, need_weights=attentions,
                           layers=layers, variants=variants, states=states,
                           weights_out=None if buf is None else {i: buf[j:j + 1] for j, i in enumerate(layers)})
            att = buf if buf is not None else self.assemble(out.attentions, layers) if attentions else None
            sal = None
            if saliency and self.decoder is not None:
                gh, gw = inp["grid"]
                sal = self.decoder(out.hidden[:, inp["n_prefix"]:], (gh, gw))[0, 0]
        return Trace(tokens=inp["tokens"], attentions=att, hidden=out.hidden[0],
                     logits=None if out.logits is None else out.logits[0], ids=inp["ids"],
                     special=inp["special"], layers=layers if attentions else [],
                     truncated=inp["truncated"], grid=inp["grid"], n_prefix=inp["n_prefix"],
                     saliency=sal, states=[s[0] for s in out.states] if states else None,
                     seconds_per_token=inp.get("seconds_per_token", 0.0))

    def assemble(self, captured: dict[int, torch.Tensor], layers: list[int]) -> torch.Tensor:
        """Stack captured layers into [len(layers), H, n, n]; pruned heads read as zero rows."""
        first = captured[layers[0]] if captured else None
        n = first.shape[-1] if first is not None else 0
        full = [b.attn.n_heads == self.cfg.n_heads for b in self.net.blocks]
        if all(full[i] for i in layers):
            return torch.stack([captured[i][0] for i in layers])
        att = torch.zeros(len(layers), self.cfg.n_heads, n, n)
        for j, i in enumerate(layers):
            if i in captured:
                att[j, self.net.blocks[i].attn.heads] = captured[i][0]
        return att

    # ---------------------------------------------------------------- pruning
    def prune(self, keep) -> "Model":
        """A NEW, smaller model without the heads `keep` (BoolTensor [n_layers, n_heads], the
        ORIGINAL head numbering) switches off; this one is untouched (see `core.surgery`)."""
        small, keep = surgery.prune(self.net, keep, self.kept)
        info = replace(self.info, key=f"{self.info.key} (pruned {int((~keep).sum())}/{keep.numel()})")
        return Model(small, info, self.tokenizer, image_mean=self.image_mean, image_std=self.image_std,
                     image_size=self.image_size, decoder=self.decoder, kept=keep, features=self.features)


def _variants(spec, n_layers):
    """None | 'linear' | Variant | {layer: spec} -> what Transformer.forward takes."""
    if spec is None:
        return None
    if isinstance(spec, dict):
        out = {}
        for layer, v in spec.items():
            if not 0 <= int(layer) < n_layers:
                raise ValueError(f"variant layer {layer} is outside 0..{n_layers - 1}")
            out[int(layer)] = parse_variant(v)
        return out
    return parse_variant(spec)

