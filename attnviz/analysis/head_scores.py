"""Previous-token, induction and duplicate-token scores for every head of a language model.

The scores TransformerLens users know, measured the way its tutorials measure them: on a batch of
repeated random-token sequences

    [BOS] + R + R        R: `seq_len` distinct ordinary tokens drawn with a seeded generator

Let p be the length of the prefix (1 with a BOS token, else 0) and T = seq_len, so R occupies
positions p .. p+T-1 and its copy p+T .. p+2T-1. For each head, with A its attention [n, n]
(post-softmax, row = query):

- previous_token = mean over q >= 1 of A[q, q-1]           (every position, both halves)
- duplicate_token = mean over q in the copy of A[q, q-T]    (the earlier copy of the same token)
- induction       = mean over q in the copy of A[q, q-T+1]  (the token that followed the earlier copy)

then the mean over the `n_seqs` sequences. All three are shares of a row's attention, in [0, 1].

Differences from TransformerLens, all small:
- TL's tutorial induction score is the mean of the whole `offset = 1-T` diagonal, which also holds
  two entries of the first half (the last two tokens of R, which have no earlier copy); here only
  the T queries of the copy count. TL's `detect_head(..., "induction_head")` instead divides by the
  attention of every row, so its values are about half of these.
- R is drawn without replacement, so every token of the copy has exactly one earlier copy and the
  duplicate / induction targets are unambiguous; TL draws with replacement from the whole vocabulary.
  Special tokens, and for byte-level BPE the tokens that are not printable text on their own (lone
  bytes, control characters), are never drawn.
- BOS: by default the sequence starts with what the model's tokenizer itself puts before text (for
  SmolLM2, nothing: its tokenizer adds no BOS), so the model sees the random tokens the way it sees
  a pasted text; `prepend_bos=True` forces the tokenizer's BOS token, TL style.
"""
from __future__ import annotations

import math
import weakref

import pandas as pd
import torch

from attnviz.base.limits import LIMITS

COLUMNS = ("layer", "head", "previous_token", "induction", "duplicate_token")
SCORES = COLUMNS[2:]
MIN_SEQ_LEN = 4          # R shorter than this gives a handful of queries per score
MAX_TOKENS = 1024        # 2T+1 tokens at most: keeps one trace's attention bounded
MAX_SEQS = 32


# ---------------------------------------------------------------- the scores of one trace
def scores_from_attention(attn: torch.Tensor, seq_len: int, prefix: int = 1) -> dict[str, torch.Tensor]:
    """Per-head scores of one repeated sequence.

    attn: [L, H, n, n] (or [H, n, n]) post-softmax attention of `prefix` tokens + R + R, with
    n == prefix + 2 * seq_len. Returns {"previous_token", "induction", "duplicate_token"}: float64
    tensors of attn's leading shape ([L, H]).
    """
    T, p = int(seq_len), int(prefix)
    n = attn.shape[-1]
    if attn.dim() < 2 or attn.shape[-2] != n:
        raise ValueError(f"attention must be [..., n, n]; got {list(attn.shape)}")
    if T < 2 or p < 0 or n != p + 2 * T:
        raise ValueError(f"attention over {n} tokens cannot hold {p} prefix token(s) + 2 x {T}")
    a = attn.double()
    prev = a.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)
    # diagonal(-k)[j] is A[j + k, j]: the copy's queries q = p+T .. p+2T-1 sit at j = q - k.
    dup = a.diagonal(offset=-T, dim1=-2, dim2=-1)[..., p:p + T].mean(-1)
    ind = a.diagonal(offset=-(T - 1), dim1=-2, dim2=-1)[..., p + 1:p + T + 1].mean(-1)
    return {"previous_token": prev, "induction": ind, "duplicate_token": dup}


# ---------------------------------------------------------------- the sequences
_ORDINARY: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # tokenizer -> {vocab size: ids}


def ordinary_tokens(model) -> torch.Tensor:
    """Ids random sequences may use: the vocabulary less special / added tokens and, when the
    tokenizer can decode single ids, less tokens that are not printable text on their own.
    Cached per tokenizer (decoding SmolLM2's 49k ids one by one takes ~0.7 s)."""
    V = model.cfg.vocab_size
    tok = model.tokenizer
    if tok is None:
        return torch.arange(V)
    try:
        cached = _ORDINARY.get(tok, {}).get(V)
    except TypeError:  # a tokenizer that cannot be weakly referenced: no cache
        cached = None
    if cached is None:
        cached = _ordinary_tokens(tok, V)
        try:
            _ORDINARY.setdefault(tok, {})[V] = cached
        except TypeError:
            pass
    return cached.clone()


def _ordinary_tokens(tok, V: int) -> torch.Tensor:
    special = set(int(i) for i in (getattr(tok, "all_special_ids", None) or []))
    added = getattr(tok, "added_tokens_decoder", None)
    if isinstance(added, dict):
        special.update(int(i) for i in added)
    keep = torch.ones(V, dtype=torch.bool)
    keep[[i for i in special if 0 <= i < V]] = False
    decode = getattr(tok, "batch_decode", None)
    if callable(decode):
        try:
            texts = decode([[i] for i in range(V)])
        except Exception:  # noqa: BLE001  a tokenizer that cannot decode lone ids: keep them all
            texts = None
        if texts is not None and len(texts) == V:
            printable = torch.tensor([bool(t.strip()) and t.isprintable() and "\ufffd" not in t
                                      for t in texts])
            keep &= printable
    return keep.nonzero().flatten()


def _tokenizer_bos(model, candidates: torch.Tensor) -> int | None:
    """The special token the tokenizer puts before a text by itself, or None."""
    tok = model.tokenizer
    if tok is None or len(candidates) == 0:
        return None
    special = set(int(i) for i in (getattr(tok, "all_special_ids", None) or []))
    try:
        probe = tok.convert_ids_to_tokens([int(candidates[0])])[0]
        if hasattr(tok, "convert_tokens_to_string"):
            probe = tok.convert_tokens_to_string([probe])
        ids = list(tok(probe)["input_ids"])
    except Exception:  # noqa: BLE001  no usable probe: assume no BOS
        return None
    return int(ids[0]) if ids and int(ids[0]) in special else None


def _resolve_bos(model, candidates, prepend_bos) -> int | None:
    if prepend_bos is None:
        return _tokenizer_bos(model, candidates)
    if not prepend_bos:
        return None
    bos = getattr(model.tokenizer, "bos_token_id", None) if model.tokenizer is not None else None
    bos = bos if bos is not None else _tokenizer_bos(model, candidates)
    if bos is None:
        raise ValueError(f"model {model.info.key!r} has no BOS token; use prepend_bos=None or False")
    return int(bos)


def check_lm(model):
    cfg = model.cfg
    if cfg.is_vision or cfg.task != "lm" or not cfg.causal:
        kind = "a vision model" if cfg.is_vision else "a bidirectional encoder"
        raise ValueError(f"head scores (previous-token, induction, duplicate-token) are defined for causal "
                         f"language models; {model.info.key!r} is {kind}. Pick a language model such as smollm2.")


def max_seq_len(model, prefix: int = 1) -> int:
    """The longest R this model takes: 2T + prefix within MAX_TOKENS and the model's positions."""
    return (min(MAX_TOKENS, model.max_tokens) - prefix) // 2


def repeated_tokens(model, seq_len: int = 50, n_seqs: int = 4, seed: int = 0,
                    prepend_bos: bool | None = None) -> tuple[torch.Tensor, int]:
    """[n_seqs, prefix + 2*seq_len] token ids (prefix + R + R, R distinct, seeded) and the prefix
    length (0 or 1)."""
    check_lm(model)
    for name, value in (("seq_len", seq_len), ("n_seqs", n_seqs), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be a whole number; got {value!r}")
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed must lie in 0..2**63-1; got {seed}")
    if not 1 <= n_seqs <= MAX_SEQS:
        raise ValueError(f"n_seqs must lie in 1..{MAX_SEQS}; got {n_seqs}")
    candidates = ordinary_tokens(model)
    bos = _resolve_bos(model, candidates, prepend_bos)
    prefix = 0 if bos is None else 1
    hi = min(max_seq_len(model, prefix), len(candidates))
    if hi < MIN_SEQ_LEN:
        raise ValueError(f"model {model.info.key!r} is too small for repeated-sequence scores "
                         f"({model.max_tokens} positions, {len(candidates)} ordinary tokens)")
    if not MIN_SEQ_LEN <= seq_len <= hi:
        raise ValueError(f"seq_len must lie in {MIN_SEQ_LEN}..{hi} for {model.info.key!r} "
                         f"(the sequence is {prefix} + 2 x seq_len tokens); got {seq_len}")
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n_seqs):
        r = candidates[torch.randperm(len(candidates), generator=g)[:seq_len]]
        rows.append(torch.cat([torch.tensor([bos] * prefix, dtype=torch.long), r, r]))
    return torch.stack(rows), prefix


# ---------------------------------------------------------------- the table
def _layer_weights(model, ids: torch.Tensor, head_mask, checks):
    """Yield (layer, heads, weights [B, h, n, n]) block by block: one pass through the model's
    block runner, the weights of one layer alive at a time."""
    net = model.net

    def check():
        for stop in checks:
            stop.check()

    with torch.inference_mode():
        steps = net.iter_blocks(net.embed_text(ids), head_mask=head_mask, capture=range(model.cfg.n_layers),
                                check=check)
        for step in steps:
            if step.weights is not None:
                yield step.layer, net.blocks[step.layer].attn.heads, step.weights
            del step


def head_scores(model, seq_len: int = 50, n_seqs: int = 4, seed: int = 0, *, prepend_bos: bool | None = None,
                head_mask=None, deadline=None, cancel=None) -> pd.DataFrame:
    """One row per head: layer, head, previous_token, induction, duplicate_token (all in [0, 1];
    NaN for heads pruned away), sorted by layer and head. Deterministic for a seed.

    seq_len: length T of the random block R (the sequence is [BOS] + R + R); n_seqs sequences are
    averaged. head_mask ([L, H], 1 keeps) is applied while running: a masked head's own pattern is
    unchanged, the heads after it see the difference. deadline / cancel: objects with .check()
    (attnviz.jobs.Deadline, Cancel), called before each layer.
    Work: one forward pass per sequence, run in batches whose one-layer weights stay within
    LIMITS.attention_capture_mb; logits are never computed.
    The frame's attrs record seq_len, n_seqs, seed, prefix (BOS or not) and bos_id.
    """
    check_lm(model)
    mask = model.check_head_mask(head_mask)
    ids, prefix = repeated_tokens(model, seq_len, n_seqs, seed, prepend_bos)
    L, H, n = model.cfg.n_layers, model.cfg.n_heads, ids.shape[1]
    per_seq = H * n * n * 4          # one layer's float32 weights of one sequence
    batch = max(1, int(LIMITS.attention_capture_mb * 2**20 // per_seq))
    checks = [c for c in (deadline, cancel) if c is not None]
    total = {k: torch.zeros(L, H, dtype=torch.float64) for k in SCORES}
    for b0 in range(0, len(ids), batch):
        for layer, heads, att in _layer_weights(model, ids[b0:b0 + batch], mask, checks):
            part = scores_from_attention(att, seq_len, prefix)   # [B, h]
            for k in SCORES:
                total[k][layer, heads] += part[k].sum(0)
    kept = model.kept.flatten()
    layer, head = torch.meshgrid(torch.arange(L), torch.arange(H), indexing="ij")
    data = {"layer": layer.flatten().numpy(), "head": head.flatten().numpy()}
    for k in SCORES:
        v = (total[k] / len(ids)).flatten().clamp(0.0, 1.0)
        v[~kept] = math.nan
        data[k] = v.numpy()
    df = pd.DataFrame(data, columns=list(COLUMNS))
    df.attrs.update(seq_len=seq_len, n_seqs=n_seqs, seed=seed, prefix=prefix,
                    bos_id=int(ids[0, 0]) if prefix else None)
    return df


def top_heads(df: pd.DataFrame, score: str, k: int = 5) -> pd.DataFrame:
    """The k heads with the highest `score` (one of previous_token, induction, duplicate_token)."""
    if score not in SCORES:
        raise ValueError(f"score must be one of {', '.join(SCORES)}; got {score!r}")
    return df.sort_values([score, "layer", "head"], ascending=[False, True, True]).head(int(k)).reset_index(drop=True)
