"""The live effect of a head mask on one text: the model's outputs with and without the mask.

`outputs(model, text, mask)` runs the model once and keeps what the Heads page shows (per-token
loss, next-token top-k, sentence embeddings, one layer's attention); `compare(full, masked)` puts
two such runs side by side. The full run depends only on the text, so callers cache it and a head
toggle recomputes only the masked side.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from .importance import _embedding, is_lm


@dataclass
class Outputs:
    tokens: list[str]
    attention: torch.Tensor | None        # [H, n, n] of `layer`
    layer: int
    token_loss: torch.Tensor | None = None  # LM: [n-1] nats, loss of token i+1 given 0..i
    logprobs: torch.Tensor | None = None    # LM: [n, V]
    embedding: torch.Tensor | None = None   # encoder: [d] L2-normalised mean-pooled
    sentence_embeddings: torch.Tensor | None = None  # encoder: [S, d] for the ranking sentences

    @property
    def perplexity(self) -> float:
        if self.token_loss is None or self.token_loss.numel() == 0:
            return float("nan")
        return math.exp(min(float(self.token_loss.mean()), 700.0))

    def top_k(self, k: int = 10, tokenizer=None) -> tuple[list[str], torch.Tensor]:
        """Next-token candidates after the last token: (labels, probabilities)."""
        probs, ids = self.logprobs[-1].exp().topk(k)
        from .tokens import labels
        # one candidate at a time: each is an alternative, not a continuation of the previous
        names = [labels(tokenizer, [i])[0][0] if tokenizer is not None else str(i) for i in ids.tolist()]
        return names, probs


def _padded(model, rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id rows -> (ids (S, T), attention_mask (S, T)), right-padded."""
    width = max(len(i) for i in rows)
    pad = getattr(model.tokenizer, "pad_token_id", None) or 0
    batch = torch.full((len(rows), width), pad, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
    for row, i in enumerate(rows):
        batch[row, :len(i)], attention_mask[row, :len(i)] = i, 1
    return batch, attention_mask


def embed_texts(model, texts: list[str], head_mask=None) -> torch.Tensor:
    """Sentence embeddings [S, d] (mean over real tokens, L2-normalised), one padded batch."""
    if not texts:
        return torch.zeros(0, model.cfg.d_model)
    mask = model.check_head_mask(head_mask)
    batch, attention_mask = _padded(model, [model.encode_text(t)[0] for t in texts])
    with torch.inference_mode():
        out = model.net(input_ids=batch, attention_mask=attention_mask, head_mask=mask, logits=False)
    return _embedding(out.hidden, attention_mask)


def _encoder_outputs(model, x, head_mask, layer: int, sentences: list[str]) -> Outputs:
    """The text and the ranking sentences in ONE padded forward pass (a toggle pays one call)."""
    mask = model.check_head_mask(head_mask)
    inp = model.inputs(x)
    n = len(inp["tokens"])
    rows = [model.encode_text(t)[0] for t in sentences]
    width = max(len(r) for r in rows)
    # Padding the sentences to a long text wastes more than a second call costs (~16 tokens' worth).
    if (1 + len(rows)) * max(n, width) > n + len(rows) * width + 16:
        tr = model.trace(inp["ids"], head_mask=mask, layers=[layer])
        return Outputs(tokens=tr.tokens, attention=tr.attentions[0], layer=layer,
                       embedding=F.normalize(tr.hidden.mean(0), dim=-1),
                       sentence_embeddings=embed_texts(model, sentences, mask))
    batch, attention_mask = _padded(model, [inp["ids"]] + rows)
    with torch.inference_mode():
        out = model.net(input_ids=batch, attention_mask=attention_mask, head_mask=mask, logits=False,
                        need_weights=True, layers=[layer])
    emb = _embedding(out.hidden, attention_mask)                         # (1 + S, d)
    return Outputs(tokens=inp["tokens"], attention=out.attentions[layer][0, :, :n, :n], layer=layer,
                   embedding=emb[0], sentence_embeddings=emb[1:])


def outputs(model, x, head_mask=None, layer: int | None = None,
            sentences: list[str] | None = None) -> Outputs:
    """One run of the (masked) model on `x` (text or token ids), keeping what the live view needs."""
    layer = model.cfg.n_layers - 1 if layer is None else int(layer)
    if not is_lm(model) and sentences:
        return _encoder_outputs(model, x, head_mask, layer, sentences)
    tr = model.trace(x, head_mask=head_mask, layers=[layer])
    out = Outputs(tokens=tr.tokens, attention=tr.attentions[0], layer=layer)
    if is_lm(model):
        lp = tr.logits.float().log_softmax(-1)                            # (n, V)
        out.logprobs = lp
        out.token_loss = -lp[:-1].gather(-1, tr.ids[1:, None])[:, 0]
    else:
        out.embedding = F.normalize(tr.hidden.mean(0), dim=-1)
        if sentences:
            out.sentence_embeddings = embed_texts(model, sentences, head_mask)
    return out


def compare(full: Outputs, masked: Outputs, sentences: list[str] | None = None) -> dict:
    """Side-by-side numbers. LM: perplexity of both, KL(full || masked) per token (mean and per
    position), top-1 agreement. Encoder: embedding cosine and the similarity ranking of the
    sentences to the text under both models."""
    if full.tokens != masked.tokens:
        raise ValueError("the two runs are on different texts")
    if full.logprobs is not None:
        p = full.logprobs.exp()
        kl = (p * (full.logprobs - masked.logprobs)).sum(-1)               # (n,)
        agree = (full.logprobs.argmax(-1) == masked.logprobs.argmax(-1)).float()
        return dict(perplexity_full=full.perplexity, perplexity_masked=masked.perplexity,
                    kl=float(kl.mean()), kl_per_token=kl, top1=float(agree.mean()))
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
