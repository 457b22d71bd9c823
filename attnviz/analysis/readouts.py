"""What a language model's residual stream says on the way: the logit lens and direct logit attribution.

Both run the text once through the one forward loop (`Transformer.iter_blocks`) and read the
residual stream it passes between blocks:

- **Logit lens** (nostalgebraist 2020): the residual after every block, at every position, through
  the final norm and the unembedding, as if the model stopped there. Row 0 is the embeddings, row
  i + 1 the output of block i; the last row is the model's own logits.
- **Direct logit attribution** (as TransformerLens' `ResidualStream.logit_attrs`): at the last
  position the final residual is a sum of parts (embeddings, each head's output through its slice
  of the output projection, output biases, each MLP). With the final norm's scale FROZEN at the
  value the full residual gives it, the norm is linear, so each part's contribution to the logit
  of a target token (minus another) adds up exactly to the model's logit (difference).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from attnviz.analysis.effects import single_token, token_names
from attnviz.base import memory, names
from attnviz.base.limits import LIMITS
from attnviz.core.layers import frozen

TOP_K = 10  # candidates kept per logit-lens cell: what a clicked cell shows


@dataclass
class Run:
    """One text through the blocks, with what the readouts need."""
    tokens: list[str]
    ids: torch.Tensor                     # [n]
    states: list[torch.Tensor]            # L + 1 residuals [n, d]: input of each block, then the last output
    heads: dict[int, torch.Tensor]        # layer -> [h_layer, d_head] per-head outputs at the last position


def check_lm(model):
    if not model.next_token:
        raise ValueError(f"{model.info.key} is not a language model: readouts need next-token logits "
                         "(pick SmolLM2, GPT-2 or a toy LM)")
    if not all(block.additive for block in model.net.blocks):
        raise ValueError("readouts need a pre-norm model, whose residual stream is a plain sum of parts")


def run(model, x, head_mask=None, *, head_outputs: bool = False, head_fill=None, check=None) -> Run:
    """`x` (text or token ids) through every block once, keeping every residual."""
    check_lm(model)
    inp = model.inputs(x)
    ids = inp["ids"]
    if len(ids) > LIMITS.readout_max_tokens:
        raise ValueError(f"the text has {len(ids)} tokens; readouts take at most {LIMITS.readout_max_tokens}. "
                         "Shorten it.")
    # no weights are kept, but a block's attention (an explicit variant's weights) is one layer's [H, n, n]
    memory.plan_capture("the readout", layers=1, heads=model.cfg.n_heads, n=len(ids), shorten="the text")
    mask = model.check_head_mask(head_mask)
    net, L = model.net, model.cfg.n_layers
    states, heads = [], {}
    with torch.inference_mode():
        x0 = net.embed_text(ids[None])
        steps = net.iter_blocks(x0, head_mask=mask, head_outputs=range(L) if head_outputs else (),
                                head_fill=head_fill, variants=getattr(model, "variant", None), check=check)
        out = x0
        for step in steps:
            states.append(step.x[0])
            if step.heads is not None:
                heads[step.layer] = step.heads[0, :, -1]          # (h, n, dh) -> (h, dh) at the last position
            out = step.out
        states.append(out[0])
    return Run(inp["tokens"], ids, states, heads)


def row_names(n_layers: int) -> list[str]:
    """Logit-lens rows: the embeddings, then the output of each block."""
    return ["embed"] + [f"L{i} out" for i in range(n_layers)]


# ---------------------------------------------------------------- logit lens
@dataclass
class Lens:
    tokens: list[str]
    ids: list[int]
    rows: list[str]                # L + 1 row names (row_names)
    top_ids: torch.Tensor          # [L+1, n, TOP_K]
    top_probs: torch.Tensor        # [L+1, n, TOP_K]
    final_ids: torch.Tensor        # [n] the model's own top-1 at each position (the last row's)
    final_probs: torch.Tensor      # [L+1, n] each row's probability of that token

    def first_top1(self, token: int, position: int = -1) -> int | None:
        """The first row at which `token` is the top-1 at `position`, or None."""
        hits = (self.top_ids[:, position, 0] == int(token)).nonzero().flatten()
        return int(hits[0]) if len(hits) else None


def lens_logits(model, state: torch.Tensor) -> torch.Tensor:
    """A residual [n, d] through the final norm and the unembedding -> logits [n, V]."""
    with torch.inference_mode():
        return model.net.finish(state[None])[1][0].float()


def logit_lens(model, x, head_mask=None, k: int = TOP_K, check=None, trace: Run | None = None) -> Lens:
    r = trace if trace is not None else run(model, x, head_mask, check=check)
    final = lens_logits(model, r.states[-1]).log_softmax(-1)             # (n, V)
    final_ids = final.argmax(-1)
    top_ids, top_probs, final_probs = [], [], []
    for state in r.states:  # row by row: one [n, V] at a time
        if check is not None:
            check()
        lp = final if state is r.states[-1] else lens_logits(model, state).log_softmax(-1)
        p, i = lp.topk(min(k, lp.shape[-1]), -1)
        top_ids.append(i)
        top_probs.append(p.exp())
        final_probs.append(lp.gather(-1, final_ids[:, None])[:, 0].exp())
    return Lens(r.tokens, r.ids.tolist(), row_names(model.cfg.n_layers), torch.stack(top_ids),
                torch.stack(top_probs), final_ids, torch.stack(final_probs))


def lens_frame(lens: Lens, tokenizer=None) -> pd.DataFrame:
    """One row per (layer row, position): the top token, its probability and that of the final prediction."""
    rows = []
    final_names = token_names(tokenizer, lens.final_ids.tolist())
    for r, name in enumerate(lens.rows):
        tops = token_names(tokenizer, lens.top_ids[r, :, 0].tolist())
        for j, tok in enumerate(lens.tokens):
            rows.append(dict(layer=name, position=j, token=tok, top_token=tops[j],
                             top_prob=float(lens.top_probs[r, j, 0]), final_prediction=final_names[j],
                             final_prediction_prob=float(lens.final_probs[r, j])))
    return pd.DataFrame(rows)


def cell_top(lens: Lens, row: int, position: int, tokenizer=None) -> pd.DataFrame:
    """The top-k candidates of one logit-lens cell."""
    ids = lens.top_ids[row, position].tolist()
    return pd.DataFrame(dict(rank=range(1, len(ids) + 1), token=token_names(tokenizer, ids), id=ids,
                             probability=lens.top_probs[row, position].tolist()))


# ---------------------------------------------------------------- direct logit attribution
@dataclass
class Attribution:
    target: int
    minus: int | None
    heads: torch.Tensor            # [L, H] each head's contribution (0 for pruned heads)
    mlps: torch.Tensor             # [L]
    embed: float                   # the embeddings' contribution
    bias: float                    # output biases, the final norm's bias, the unembedding's bias
    logit_diff: float              # the model's own logit (difference), from its logits
    scale: float                   # the frozen final-norm scale 1 / rms (or 1 / std)

    @property
    def total(self) -> float:
        return float(self.heads.sum() + self.mlps.sum()) + self.embed + self.bias

    def top_heads(self, k: int = 5) -> list[tuple[int, int, float]]:
        """The k heads with the largest contribution: (layer, head, contribution)."""
        flat = self.heads.flatten()
        order = flat.argsort(descending=True)[:k]
        H = self.heads.shape[1]
        return [(int(i) // H, int(i) % H, float(flat[i])) for i in order]


def attribution(model, x, target: int, minus: int | None = None, head_mask=None, check=None,
                trace: Run | None = None) -> Attribution:
    """Each head's and each MLP's direct contribution to logit[target] (- logit[minus]) at the last
    position, the final norm's scale frozen (see the module docstring)."""
    vocab = model.cfg.vocab_size
    for t in (target, minus):
        if t is not None and not 0 <= int(t) < vocab:
            raise ValueError(f"token id {t} is outside the vocabulary (0..{vocab - 1})")
    if minus is not None and int(minus) == int(target):
        raise ValueError("the target and the minus token are the same: pick two different tokens")
    r = trace if trace is not None and trace.heads else run(model, x, head_mask, head_outputs=True, check=check)
    net, cfg = model.net, model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    W_U = net.lm_head.weight.float()
    direction = W_U[int(target)] - (W_U[int(minus)] if minus is not None else 0)      # (d,)
    with torch.inference_mode():
        last = r.states[-1][-1].float()
        f, norm_bias, scale = frozen(net.norm, last)
        bias = float(norm_bias @ direction)
        if net.lm_head.bias is not None:
            b = net.lm_head.bias.float()
            bias += float(b[int(target)] - (b[int(minus)] if minus is not None else 0))
        heads = torch.zeros(L, H)
        mlps = torch.zeros(L)
        for i, block in enumerate(net.blocks):
            x_in, x_out = r.states[i][-1].float(), r.states[i + 1][-1].float()
            # each head's share of what the block adds, as the block says it reaches the residual
            per_head, const = block.head_parts(r.heads[i])              # (h, d), (d,)
            bias += float(f(const) @ direction)
            heads[i, block.attn.heads] = f(per_head) @ direction
            mlps[i] = f(x_out - x_in - per_head.sum(0) - const) @ direction  # the rest of the block: its MLP
        embed = float(f(r.states[0][-1].float()) @ direction)
        # the sum the logits' soft cap (Gemma 2) bends: the parts add up to it, not to the capped logit
        logits = net.finish(r.states[-1][-1:][None].float(), softcap=False)[1][0, 0].float()
    real = float(logits[int(target)] - (logits[int(minus)] if minus is not None else 0))
    return Attribution(int(target), None if minus is None else int(minus), heads, mlps, embed, bias, real,
                       float(scale))


def attribution_frame(att: Attribution) -> pd.DataFrame:
    """One row per part: every head, every MLP, the embeddings and the bias terms."""
    L, H = att.heads.shape
    rows = [dict(part=names.head_name(i, h), kind="head", layer=i, head=h, contribution=float(att.heads[i, h]))
            for i in range(L) for h in range(H)]
    rows += [dict(part=f"L{i} MLP", kind="mlp", layer=i, head=None, contribution=float(att.mlps[i]))
             for i in range(L)]
    rows += [dict(part="embeddings", kind="embed", layer=None, head=None, contribution=att.embed),
             dict(part="biases", kind="bias", layer=None, head=None, contribution=att.bias)]
    frame = pd.DataFrame(rows)
    frame["head"] = frame["head"].astype("Int64")
    frame["layer"] = frame["layer"].astype("Int64")
    return frame


def top_off_mask(att: Attribution, k: int) -> torch.Tensor:
    """A head mask [L, H] (1 = on) with the k most positively contributing heads off."""
    keep = torch.ones_like(att.heads)
    for i, h, _ in att.top_heads(k):
        keep[i, h] = 0
    return keep


def likely_targets(tokenizer, last_logits: torch.Tensor, n: int = 2, look: int = 50) -> list[str]:
    """The `n` most likely next tokens of `last_logits` [V], spelt so that typing them back names
    the same one token (` Mary`): fitting target / minus tokens for a prompt the user typed. A
    token whose text does not come back as itself (a byte piece, a merge) is skipped."""
    found = []
    for token_id in last_logits.topk(min(look, last_logits.numel())).indices.tolist():
        spelt = tokenizer.decode([token_id])
        try:
            ok = single_token(tokenizer, spelt)[0] == token_id
        except ValueError:
            ok = False
        if ok:
            found.append(spelt)
            if len(found) == n:
                break
    return found
