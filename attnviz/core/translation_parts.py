"""What a translation is made of, apart from the model: its result (`Translation`), the tokenizer
adapter (`Pieces`) and the lexical shortlist (`Shortlist`). `attnviz.core.translator` decodes."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from attnviz.core import tokens

UNKNOWN = "⟨unk⟩"  # appended to the label of a source piece outside the vocabulary


class Pieces:
    """What translation needs from a tokenizer, over a `tokenizers.Tokenizer` (Bergamot's
    tokenizer.json: no end of sentence added, so we add it) or a transformers tokenizer (which
    adds its own).

    A tokenizer that reads a model of its own for each side (opus-mt's source.spm and target.spm)
    splits a target text with the target side's; it switches sides by changing its own state, so
    its calls are serialised: one model serves every session at once."""

    def __init__(self, tokenizer, eos_id: int, unk_id: int | None = None):
        self.tokenizer, self.eos_id = tokenizer, eos_id
        self.native = hasattr(tokenizer, "id_to_token")  # tokenizers.Tokenizer, not transformers'
        if unk_id is None:
            unk_id = tokenizer.token_to_id("<unk>") if self.native else getattr(tokenizer, "unk_token_id", None)
        self.unk_id = unk_id
        self.two_sided = "target_spm" in (getattr(tokenizer, "vocab_files_names", None) or {})
        self.lock = threading.Lock()
        self.kind = tokens.tokenizer_kind(tokenizer)
        if self.native:
            specials = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
        else:
            specials = set(getattr(tokenizer, "all_special_ids", None) or [])
        self.special_ids = (specials | {eos_id}) - {unk_id}   # an unknown piece shows the text it stands for

    def encode(self, text: str, target: bool = False) -> tuple[list[int], list[str]]:
        """(ids ending with the end of sentence, labels) of a source text, or of a target text
        (`target`); an unknown piece is labelled with the text it stands for, marked ⟨unk⟩. The
        text was checked first (`BaseModel.check_text`)."""
        if self.native:
            enc = self.tokenizer.encode(text)
            ids = list(enc.ids) + [self.eos_id]
            labels = self.labels(ids, list(enc.tokens) + [self.tokenizer.id_to_token(self.eos_id)])
        else:
            with self.lock:
                side = {"text_target": text} if target and self.two_sided else {"text": text}
                ids = list(self.tokenizer(**side)["input_ids"])
            if not ids or ids[-1] != self.eos_id:
                ids.append(self.eos_id)
            labels = self.labels(ids)
        labels = [f"{lab}{UNKNOWN}" if i == self.unk_id else lab for i, lab in zip(ids, labels)]
        return ids, labels

    def labels(self, ids, pieces=None) -> list[str]:
        """Readable labels of a run of ids, as `tokens.labels` writes them (" love", not "▁love");
        ``pieces``: the encoder's own pieces, which name an unknown piece by its text."""
        ids = [int(i) for i in ids]
        if pieces is not None:
            pass
        elif self.native:
            pieces = [self.tokenizer.id_to_token(i) for i in ids]
        else:
            pieces = self.tokenizer.convert_ids_to_tokens(ids)
        return tokens.piece_labels(pieces, [i in self.special_ids for i in ids], self.kind, ids)[0]

    def label(self, i: int) -> str:
        return self.labels([i])[0]

    def decode(self, ids: list[int]) -> str:
        ids = [int(i) for i in ids if int(i) != self.eos_id]
        if self.native:
            return self.tokenizer.decode(ids)
        with self.lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)


@dataclass
class Translation:
    text: str
    source_tokens: list[str]
    target_tokens: list[str]
    source_ids: torch.Tensor                    # [n_src], the end of sentence included
    target_ids: torch.Tensor                    # [n_tgt]
    cross_attentions: torch.Tensor | None       # [L_dec, H, n_tgt, n_src]
    encoder_attentions: torch.Tensor | None     # [L_enc, H, n_src, n_src]
    logprobs: torch.Tensor                      # [n_tgt]
    top_ids: torch.Tensor | None = None         # [n_tgt, TOP_K] the likeliest next tokens at each step
    top_logprobs: torch.Tensor | None = None    # [n_tgt, TOP_K]
    self_attentions: torch.Tensor | None = None  # [L_dec, H, n_tgt, n_tgt] (attention decoders)
    stopped: str = "eos"                        # eos | max_tokens | deadline | given (teacher-forced)
    truncated: int = 0                          # source tokens cut to fit LIMITS.max_source_tokens
    max_tokens: int = 0                         # the target-token bound this decoding ran under
    beam: int = 1

    @property
    def logprob(self) -> float:
        return float(self.logprobs.sum())

    @property
    def n_src(self) -> int:
        return len(self.source_tokens)

    @property
    def n_tgt(self) -> int:
        return len(self.target_tokens)

    @property
    def unknown(self) -> list[str]:
        """Source pieces outside the vocabulary (shown, not dropped)."""
        return [t for t in self.source_tokens if t.endswith(UNKNOWN)]


@dataclass(frozen=True)
class Shortlist:
    """A lexical shortlist (Marian's `lex.*.s2t.bin`): the `first` most frequent target pieces plus,
    for every source piece w, its likeliest translations `pieces[offsets[w]:offsets[w + 1]]`.
    Scoring only these (a few hundred of 32,000) is what the native engine does at every step."""
    first: int
    offsets: torch.Tensor   # [vocab + 1] int64
    pieces: torch.Tensor    # [n] int64

    def candidates(self, source_ids: torch.Tensor) -> torch.Tensor:
        """Sorted target ids a sentence may use."""
        ids = torch.as_tensor(source_ids, dtype=torch.long)
        ids = ids[(ids >= 0) & (ids < len(self.offsets) - 1)]
        starts = self.offsets[ids]
        lengths = self.offsets[ids + 1] - starts
        # every source piece's range pieces[start:start + length], gathered at once (no Python loop)
        ends = torch.cumsum(lengths, 0)
        at = torch.arange(int(ends[-1]) if len(ends) else 0) + torch.repeat_interleave(starts - (ends - lengths), lengths)
        return torch.unique(torch.cat([torch.arange(self.first), self.pieces[at]]))


def self_matrix(rows: list[list[torch.Tensor]]) -> torch.Tensor | None:
    """Per-step self-attention rows (each [H, t+1]) -> [L, H, n, n], zero above the diagonal."""
    if not rows:
        return None
    n, L, H = len(rows), len(rows[0]), rows[0][0].shape[0]
    out = torch.zeros(L, H, n, rows[-1][0].shape[-1])  # keys: n, or n + prompt - 1 after a prompt
    for t, per_layer in enumerate(rows):
        for j, r in enumerate(per_layer):
            out[j, :, t, :r.shape[-1]] = r
    return out
