"""What every loaded model shares: `BaseModel` (input checks, info, fingerprint, limits, the
`trace` entry) and `ModelInfo`; `adopt_state`, the one way a network takes converted tensors.

The decoder / encoder / vision `Model`, the translator `Seq2SeqModel` and the speech model
`SpeechModel` all derive from `BaseModel`, so a bad head mask, bad token ids or bad text get the
same check and the same message whichever model is asked.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from attnviz.base.limits import LIMITS
from attnviz.core import tokens


def count_params(*modules) -> int:
    """Parameters of the given modules (None skipped): the one parameter count."""
    return sum(p.numel() for m in modules if m is not None for p in m.parameters())


def weights_fingerprint(*modules) -> str:
    """SHA-256 of every parameter and buffer of the modules (None skipped), in order: shows that a
    shared model was never changed by the sessions using it."""
    h = hashlib.sha256()
    for module in modules:
        if module is None:
            continue
        for name, t in module.state_dict().items():
            h.update(name.encode())
            h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def adopt_state(build, state: dict, *, tied: bool):
    """`build()` constructed on the "meta" device, then given `state`'s tensors (no copy, no random
    initialisation). `tied`: the output matrix is the token embedding's, so the state may leave
    `lm_head.weight` out. ValueError when the tensors do not fit."""
    with torch.device("meta"):
        net = build()
    try:
        missing, unexpected = net.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as err:  # a shape mismatch
        raise ValueError(f"weights do not fit the model's config: {str(err)[:500]}") from None
    if tied and getattr(net, "lm_head", None) is not None:
        net.lm_head.weight = net.tok.weight
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weights do not match the architecture: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    return net.eval()


@dataclass(frozen=True)
class ModelInfo:
    key: str
    family: str
    task: str            # encoder | lm | vision | translation | speech
    n_layers: int        # an encoder-decoder's encoder and decoder layers together
    n_heads: int
    source: str          # where the weights come from
    n_kv_heads: int = 0
    max_positions: int = 0
    params: int = 0
    licence: str = ""
    size_mb: float = 0.0


class BaseModel:
    """A network of ours plus what turns user input into its input. Shared by every session and
    never mutated by a call: masks and capture are arguments."""

    def __init__(self, net, info: ModelInfo):
        self.net = net.eval()
        self.info = info
        for p in self.net.parameters():
            p.requires_grad_(False)
        if LIMITS.packed_linear:
            self.net.pack()

    @property
    def cfg(self):
        return self.net.cfg

    # ---------------------------------------------------------------- what a subclass says
    @classmethod
    def shape(cls, cfg) -> dict:
        """The `ModelInfo` fields read from a config: n_layers, n_heads, n_kv_heads, max_positions."""
        raise NotImplementedError

    @property
    def has_tokenizer(self) -> bool:
        raise NotImplementedError

    # Model-kind questions are asked of the model, never switched on across the library.
    @property
    def kind(self) -> str:
        """"lm" | "encoder" | "vision" | "translator" | "speech": what the model reads and writes."""
        raise NotImplementedError

    @property
    def next_token(self) -> bool:
        """Whether the model predicts the next token of its own input (a language-model head)."""
        return False

    @property
    def mask_layers(self) -> int:
        """The rows of `head_mask`: the layers whose heads it switches."""
        return self.cfg.n_layers

    @property
    def id_limit(self) -> int | None:
        """The most token ids one input may hold (None: longer inputs are cut, not refused)."""
        return None

    def target_bound(self, n_src: int) -> int:
        """The most tokens a decoder writes for a source of `n_src` tokens."""
        raise NotImplementedError

    def parts(self) -> tuple:
        """The modules whose weights are the model (the fingerprint and the parameter count)."""
        return (self.net,)

    def trace(self, x, head_mask=None, **options):
        """Run the model once on `x` and return what it computed, attention included."""
        raise NotImplementedError

    # ---------------------------------------------------------------- info
    @classmethod
    def describe(cls, key: str, cfg, source: str, net, **extra) -> ModelInfo:
        """The one `ModelInfo` constructor for a built network: its shape from `cfg`, its
        parameter count from `net`, `extra` (licence, size_mb) as given."""
        return ModelInfo(key=key, family=cfg.family, task=cfg.task, source=source,
                         params=count_params(net), **cls.shape(cfg), **extra)

    def fingerprint(self) -> str:
        """SHA-256 of every parameter and buffer, in order: shows that a shared model was never
        changed by the sessions using it."""
        return weights_fingerprint(*self.parts())

    def num_params(self) -> int:
        return count_params(*self.parts())

    # ---------------------------------------------------------------- checks
    def check_head_mask(self, mask, n_layers: int | None = None, what: str = "head_mask") -> torch.Tensor | None:
        """A float [n_layers, n_heads] mask in [0, 1] (1 keeps a head, 0 removes it), or None.
        `n_layers`: the rows expected (default `mask_layers`); `what`: the name messages use."""
        if mask is None:
            return None
        n_layers = self.mask_layers if n_layers is None else n_layers
        want = [n_layers, self.cfg.n_heads]
        try:
            m = torch.as_tensor(mask, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"{what} must be a float tensor of shape {want} (layers x heads)") from None
        if list(m.shape) != want:
            raise ValueError(f"{what} must have shape {want} (layers x heads); got {list(m.shape)}")
        if torch.isnan(m).any() or m.min() < 0 or m.max() > 1:
            raise ValueError(f"{what} values must lie in [0, 1] (1 keeps a head, 0 removes it)")
        return m

    def check_ids(self, x, what: str = "input") -> torch.Tensor:
        """Token ids given directly: a non-empty 1-D integer list or tensor within the vocabulary
        (and within `id_limit`) -> LongTensor [n]. `what`: the name messages use."""
        try:
            ids = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            ids = None
        kind = f"the {what} must be text or a 1-D list (or LongTensor) of integer token ids"
        if ids is None or ids.dim() != 1:
            raise ValueError(kind)
        if ids.numel() == 0:  # before the type: an empty list reads as float
            raise ValueError(f"the {what} has no token ids; give at least one")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(kind)
        limit = self.id_limit
        if limit is not None and ids.numel() > limit:
            raise ValueError(f"the {what} has {ids.numel()} tokens, more than the model's {limit} positions")
        vocab = self.cfg.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"{what} token ids must lie in [0, {vocab})")
        return ids.long()

    def check_text(self, text: str) -> str:
        """Text to tokenize: not empty, within the character limit, valid Unicode, and a model
        with a tokenizer to read it. Refused before tokenizing: positions cap the tokens."""
        if not text or not text.strip():
            raise ValueError("the text is empty; type or paste a sentence")
        if len(text) > LIMITS.max_text_chars:
            raise ValueError(f"the text has {len(text):,} characters; the limit is {LIMITS.max_text_chars:,}. "
                             "Paste a shorter passage.")
        tokens.check_text(text)
        if not self.has_tokenizer:
            raise ValueError(f"model {self.info.key!r} has no tokenizer; pass token ids instead of text")
        return text

    def target_limit(self, n_src: int, max_tokens=None) -> int:
        """How many tokens a decoder may write: `max_tokens` (a whole number >= 1) capped by the
        model's bound, or the bound itself."""
        bound = self.target_bound(n_src)
        if max_tokens is None:
            return bound
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a whole number of at least 1, got {max_tokens!r}")
        return min(max_tokens, bound)
