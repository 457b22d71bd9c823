"""The live effect of a head mask on one text: the model's outputs with and without the mask.

`outputs(model, text, mask)` runs the model once and keeps what the Heads page shows (per-token
loss, next-token top-k, sentence embeddings, one layer's attention); `output_change(full, masked)` puts
two such runs side by side. The full run depends only on the text, so callers cache it and a head
toggle recomputes only the masked side.

A mask changes nothing before the first layer it touches, so a run keeps the input of every
block (`states`) and the next run on the same text starts at the first layer whose mask differs
from the best earlier run it is given (`base`): a toggle in layer 20 of 30 runs 10 layers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import torch

from attnviz.analysis import head_ablation
from attnviz.analysis.importance import plain_ids
from attnviz.core.tokens import LEADING_SPACE_MARKS, check_text, labels, piece_bytes, tokenizer_kind
from attnviz.core.transformer import sentence_embedding


@dataclass
class Outputs:
    tokens: list[str]
    attention: torch.Tensor | None        # [H, n, n] of `layer`
    layer: int
    token_loss: torch.Tensor | None = None  # LM: [n-1] nats, loss of token i+1 given 0..i
    logprobs: torch.Tensor | None = None    # LM: [n, V]
    embedding: torch.Tensor | None = None   # encoder: [d] L2-normalised mean-pooled
    sentence_embeddings: torch.Tensor | None = None  # encoder: [S, d] for the ranking sentences
    ids: tuple[int, ...] | None = None      # the token ids run (set where `states` is kept)
    mask: torch.Tensor | None = None        # [L, H] float: the mask this run used (1 = on)
    states: list[torch.Tensor] | None = None  # input of every block [n, d], then the final hidden
    start: int = 0                          # the first block this run computed (the rest came from a base)
    ablation: str = "zero"                  # how the mask's heads were removed: zero | mean (analysis.ablation)
    _memo: dict = field(default_factory=dict, repr=False, compare=False)  # derived tensors, computed once

    @property
    def perplexity(self) -> float:
        if self.token_loss is None or self.token_loss.numel() == 0:
            return float("nan")
        return math.exp(min(float(self.token_loss.mean()), 700.0))

    def top_k(self, k: int = 10, tokenizer=None) -> tuple[list[str], torch.Tensor]:
        """Next-token candidates after the last token: (labels, probabilities)."""
        probs, ids = self.logprobs[-1].exp().topk(min(k, self.logprobs.shape[-1]))
        return token_names(tokenizer, ids.tolist()), probs


def token_names(tokenizer, ids: list[int]) -> list[str]:
    """Readable labels, one token at a time: each is an alternative, not a continuation. A
    byte-level token that is only part of a character (common for CJK and emoji) shows its
    bytes, e.g. "⟨E4 BD⟩…", instead of a replacement character."""
    if tokenizer is None:
        return [str(i) for i in ids]
    kind = tokenizer_kind(tokenizer)
    names = []
    for token_id in ids:
        name = labels(tokenizer, [token_id])[0][0]
        if "\ufffd" in name:
            raw = piece_bytes(tokenizer.convert_ids_to_tokens(token_id), kind)
            name = "⟨" + " ".join(f"{b:02X}" for b in raw) + "⟩…"
        names.append(name)
    return names


def _padded(model, rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id rows -> (ids (S, T), attention_mask (S, T)), right-padded."""
    width = max(len(i) for i in rows)
    pad = getattr(model.tokenizer, "pad_token_id", None) or 0
    batch = torch.full((len(rows), width), pad, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
    for row, i in enumerate(rows):
        batch[row, :len(i)], attention_mask[row, :len(i)] = i, 1
    return batch, attention_mask


def embed_texts(model, texts: list[str], head_mask=None, head_fill=None) -> torch.Tensor:
    """Sentence embeddings [S, d] (mean over real tokens, L2-normalised), one padded batch."""
    if not texts:
        return torch.zeros(0, model.cfg.d_model)
    mask = model.check_head_mask(head_mask)
    batch, attention_mask = _padded(model, [model.encode_text(t)[0] for t in texts])
    with torch.inference_mode():
        out = model.net(input_ids=batch, attention_mask=attention_mask, head_mask=mask, logits=False,
                        head_fill=head_fill)
    return sentence_embedding(out.hidden, attention_mask)


def _encoder_outputs(model, x, head_mask, layer: int, sentences: list[str], ablation: str = "zero",
                     means=None) -> Outputs:
    """The text and the ranking sentences in ONE padded forward pass (a toggle pays one call)."""
    mask = model.check_head_mask(head_mask)
    fill = head_ablation.fill(mask, ablation, means)
    inp = model.inputs(x)
    n = len(inp["tokens"])
    rows = [model.encode_text(t)[0] for t in sentences]
    width = max(len(r) for r in rows)
    # Padding the sentences to a long text wastes more than a second call costs (~16 tokens' worth).
    if fill is None and (1 + len(rows)) * max(n, width) > n + len(rows) * width + 16:
        tr = model.trace(inp["ids"], head_mask=mask, layers=[layer])
        return Outputs(tokens=tr.tokens, attention=tr.attentions[0], layer=layer,
                       embedding=sentence_embedding(tr.hidden),
                       sentence_embeddings=embed_texts(model, sentences, mask))
    batch, attention_mask = _padded(model, [inp["ids"]] + rows)
    with torch.inference_mode():
        out = model.net(input_ids=batch, attention_mask=attention_mask, head_mask=mask, logits=False,
                        need_weights=True, layers=[layer], head_fill=fill)
    emb = sentence_embedding(out.hidden, attention_mask)                         # (1 + S, d)
    return Outputs(tokens=inp["tokens"], attention=out.attentions[layer][0, :, :n, :n], layer=layer,
                   embedding=emb[0], sentence_embeddings=emb[1:], ablation=ablation)


def _effective(model, head_mask) -> torch.Tensor:
    m = model.check_head_mask(head_mask)
    return torch.ones(model.cfg.n_layers, model.cfg.n_heads) if m is None else m


def first_change(mask: torch.Tensor, base: Outputs | None, ids: tuple[int, ...], layer: int) -> int:
    """The first block a run with `mask` must compute when it may start from `base`'s states:
    0 without a usable base, n_layers when nothing differs."""
    if base is None or base.states is None or base.ids != ids or base.mask is None:
        return 0
    differs = (mask != base.mask).any(1)
    start = int(differs.float().argmax()) if differs.any() else len(differs)
    if base.layer != layer or base.attention is None:  # the captured layer must be recomputed
        start = min(start, layer)
    return start


def _continue(model, x: torch.Tensor, start: int, mask: torch.Tensor, layer: int, fill=None):
    """Blocks start.. of the model from x = the input of block `start` ([n, d]), through the
    model's own block runner. Returns (states of blocks start.., final hidden, logits or None,
    attention of `layer` or None)."""
    net = model.net
    run = net.run_blocks(x[None], start, head_mask=mask, capture=(layer,), states=True, head_fill=fill)
    hidden, logits = net.finish(run.x, logits=model.next_token)
    att = run.weights.get(layer)
    return ([s[0] for s in run.states], hidden[0], None if logits is None else logits[0],
            None if att is None else att[0])


def _stateful_outputs(model, x, head_mask, layer: int, bases, ablation: str = "zero", means=None) -> Outputs:
    """One unpadded run that keeps every block's input, starting where the best base allows."""
    cfg = model.cfg
    mask = _effective(model, head_mask)
    fill = head_ablation.fill(mask, ablation, means)
    # a base removed its heads the same way, or had none off (then both ways are the same run)
    bases = [b for b in bases if b.ablation == ablation or (b.mask is not None and bool((b.mask == 1).all()))]
    if isinstance(x, str):
        ids = model.encode_text(x)[0]
    else:
        ids = model.check_ids(x)
    key = tuple(ids.tolist())
    best, start = None, 0
    for base in bases:
        s = first_change(mask, base, key, layer)
        if s > start:
            best, start = base, s
    lm = model.next_token
    with torch.inference_mode():
        if best is not None and start >= cfg.n_layers and best.layer == layer:
            return best  # the same mask on the same text: nothing to compute
        if best is None:
            tokens = model.inputs(ids)["tokens"]
            x0 = model.net.embed_text(ids[None])[0]
            prefix = []
        else:
            tokens = best.tokens
            x0 = best.states[start]
            prefix = best.states[:start]
        states, hidden, logits, att = _continue(model, x0, start, mask, layer, fill)
    if att is None:  # the captured layer lies before `start`: the base computed it the same way
        att = best.attention
    out = Outputs(tokens=tokens, attention=att, layer=layer, ids=key, mask=mask,
                  states=prefix + states + [hidden], start=start, ablation=ablation)
    if lm:
        lp = logits.float().log_softmax(-1)                               # (n, V)
        out.logprobs = lp
        out.token_loss = -lp[:-1].gather(-1, ids[1:, None])[:, 0]
    else:
        out.embedding = sentence_embedding(hidden)
    return out


def outputs(model, x, head_mask=None, layer: int | None = None,
            sentences: list[str] | None = None, base=None, ablation: str = "zero", means=None) -> Outputs:
    """One run of the (masked) model on `x` (text or token ids), keeping what the live view needs.

    `base`: an earlier `Outputs` on the same ids (or a list of them, e.g. the full model's run and
    the previous masked one): the run starts at the first layer whose mask differs from the base
    that lets it start latest. Exact: the layers before are the same computation on the same input.
    `ablation`: the mask's heads output 0 ("zero") or their mean over the evaluation text ("mean";
    `means` from analysis.ablation.head_means, computed when not given).
    """
    means = head_ablation.resolve_means(model, ablation, means)
    layer = model.cfg.n_layers - 1 if layer is None else int(layer)
    if not 0 <= layer < model.cfg.n_layers:
        raise ValueError(f"layer must lie in 0..{model.cfg.n_layers - 1}")
    if not model.next_token and sentences:
        return _encoder_outputs(model, x, head_mask, layer, sentences, ablation, means)
    if not model.cfg.is_vision:
        bases = [] if base is None else list(base) if isinstance(base, (list, tuple)) else [base]
        return _stateful_outputs(model, x, head_mask, layer, [b for b in bases if b is not None], ablation, means)
    if ablation != "zero":
        raise ValueError("mean ablation is offered for text models; image models switch heads off by zeroing them")
    tr = model.trace(x, head_mask=head_mask, layers=[layer])
    return Outputs(tokens=tr.tokens, attention=tr.attentions[0], layer=layer,
                   embedding=sentence_embedding(tr.hidden))


def output_change(full: Outputs, masked: Outputs, sentences: list[str] | None = None) -> dict:
    """Side-by-side numbers. LM: perplexity of both, KL(full || masked) per token (mean and per
    position), top-1 agreement. Encoder: embedding cosine and the similarity ranking of the
    sentences to the text under both models."""
    if full.tokens != masked.tokens:
        raise ValueError("the two runs are on different texts")
    if full.logprobs is not None:
        if "p" not in full._memo:  # the full side is shared and cached: its parts are computed once
            p = full.logprobs.exp()
            full._memo.update(p=p, neg_entropy=(p * full.logprobs).sum(-1), top=full.logprobs.argmax(-1))
        p, top_full = full._memo["p"], full._memo["top"]
        kl = full._memo["neg_entropy"] - (p * masked.logprobs).sum(-1)    # (n,) KL(full || masked)
        top_masked = masked.logprobs.argmax(-1)
        agree = (top_full == top_masked).float()
        return dict(perplexity_full=full.perplexity, perplexity_masked=masked.perplexity,
                    kl=float(kl.mean()), kl_per_token=kl, top1=float(agree.mean()),
                    flipped_positions=int((agree == 0).sum()))
    result = dict(cosine=float((full.embedding * masked.embedding).sum()))
    if sentences and full.sentence_embeddings is not None:
        sim_full = full.sentence_embeddings @ full.embedding
        sim_masked = masked.sentence_embeddings @ masked.embedding
        table = pd.DataFrame(dict(sentence=sentences, similarity_full=sim_full.numpy(),
                                  similarity_masked=sim_masked.numpy()))
        table["rank_full"] = table["similarity_full"].rank(ascending=False, method="first").astype(int)
        table["rank_masked"] = table["similarity_masked"].rank(ascending=False, method="first").astype(int)
        result["ranking"] = table.sort_values("rank_full").reset_index(drop=True)
        result["rank_changes"] = int((table["rank_full"] != table["rank_masked"]).sum())
    return result


# ---------------------------------------------------------------- one token, at the last position
SPACE_MARKS = LEADING_SPACE_MARKS  # how tokenizers (and this app's labels) show a leading space
# One token is a few dozen characters at most: a longer text is refused before it is tokenised, and
# a refusal quotes only the first pieces (100,000 pasted characters once meant a 3 MB message).
TOKEN_CHARS, QUOTED_PIECES = 64, 8


def single_token(tokenizer, text: str) -> tuple[int, str | None]:
    """The id of the ONE token a user typed (" Mary", as the labels show it; "▁Mary" and "Ġmary"
    as tokenizers write pieces are read too), and a
    note when a leading space would name a different token. ValueError saying how the text
    tokenizes when it is not exactly one token."""
    if tokenizer is None:
        raise ValueError("this model has no tokenizer")
    if len(str(text)) > TOKEN_CHARS:
        raise ValueError(f"{len(str(text)):,} characters are far more than one token: type a single token "
                         f"(at most {TOKEN_CHARS} characters), e.g. ' Mary'")
    raw = check_text(str(text))
    if not raw.strip():
        raise ValueError("type a token, e.g. ' Mary' (with its leading space, as after a word)")
    word = raw
    for mark in SPACE_MARKS:
        if word.startswith(mark):
            word = " " + word[len(mark):]
    ids = plain_ids(tokenizer, word)
    if len(ids) != 1:
        names = token_names(tokenizer, ids[:QUOTED_PIECES])
        pieces = " + ".join(f"'{n}'" for n in names) if names else "nothing"
        pieces += f" + {len(ids) - QUOTED_PIECES:,} more" if len(ids) > QUOTED_PIECES else ""
        raise ValueError(f"'{raw}' is {len(ids)} tokens for this model ({pieces}), not one: "
                         "type a single token, e.g. one of the candidates in the chart"
                         + ("" if word.startswith(" ") else " (words after a space start with one: "
                            f"' {word.strip()}')"))
    note = None
    if not word.startswith(" "):
        spaced = plain_ids(tokenizer, " " + word)
        if len(spaced) == 1 and spaced[0] != ids[0]:
            note = (f"'{word}' is read without a leading space; after a word the model predicts "
                    f"' {word}' (another token): type it with the space")
    return int(ids[0]), note


def last_position(full: Outputs, masked: Outputs, target: int, other: int | None = None) -> dict:
    """At the last position: probability of `target` under both runs, the logit difference
    target − other (a log-probability difference: the normaliser cancels), and whether the top-1
    prediction flips."""
    if full.logprobs is None or masked.logprobs is None:
        raise ValueError("next-token numbers need a language model")
    vocab = full.logprobs.shape[-1]
    for t in (target, other):
        if t is not None and not 0 <= int(t) < vocab:
            raise ValueError(f"token id {t} is outside the vocabulary (0..{vocab - 1})")
    lf, lm = full.logprobs[-1], masked.logprobs[-1]
    out = dict(prob_full=float(lf[target].exp()), prob_masked=float(lm[target].exp()),
               top1_full=int(lf.argmax()), top1_masked=int(lm.argmax()))
    out["flipped"] = out["top1_full"] != out["top1_masked"]
    if other is not None:
        out["logit_diff_full"] = float(lf[target] - lf[other])
        out["logit_diff_masked"] = float(lm[target] - lm[other])
    return out


def attention_note(keep: torch.Tensor, layer: int) -> str | None:
    """Why the attention-change map of `layer` looks the way it does, or None when it shows a change."""
    keep = torch.as_tensor(keep).bool()
    if keep.all():
        return "Every head is on: the masked model is the full model, so the change is zero everywhere."
    off_layers = (~keep).any(1).nonzero().flatten().tolist()
    first = off_layers[0]
    rule = ("A mask scales a head's output, not its weights: a layer's attention changes only through "
            "the heads switched off in the layers before it")
    if first >= layer:
        n_off = int((~keep).sum())
        where = f"layer {first}" if len(off_layers) == 1 else f"layers {first}–{off_layers[-1]}"
        if first == keep.shape[0] - 1:
            return (f"{rule}. The {n_off} head(s) off are in the last layer, so no attention map can "
                    "change: see the outputs above.")
        return (f"{rule}. The {n_off} head(s) off are in {where}, so layer {layer}'s map is all zero: "
                f"pick layer {first + 1} or later.")
    return rule + "."
