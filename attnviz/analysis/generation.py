"""Generation from a prompt, token by token, through the one forward loop with a key/value cache.

The prompt runs once (filling a per-call cache: one dict of keys and values per layer), then each
new token runs alone at its position, reading every earlier token's keys and values from the
cache: the same numbers as rerunning the whole text each step (tests/test_generate.py), at a
fraction of the cost. Each step keeps the next-token distribution's top candidates, the token
chosen, and the attention row of the query that predicted it (the last position so far) in every
layer and head. A head mask (and mean ablation) applies at every step, so two continuations can
be compared.

Sampling: greedy by default (temperature 0); otherwise softmax(logits / temperature) restricted to
the top-k tokens and to the smallest set whose probability reaches top-p, drawn with a seeded
generator (the same seed gives the same text). Bounded by LIMITS.max_generate_tokens, the model's
positions and LIMITS.max_generate_seconds (keeping the steps made), holding a heavy-job slot. The
prompt is bounded like every readout (LIMITS.readout_max_tokens, refused before any block runs), and
its pass records no attention: all but its last token fill the cache without weights, then the last
token alone records the one row a step keeps, so no layer ever holds an n x n pattern.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch

from attnviz.analysis import head_ablation
from attnviz.analysis.effects import token_names
from attnviz.base import jobs, memory
from attnviz.base.limits import LIMITS
from attnviz.core.tokens import labels

TOP = 10  # candidates kept per step (the probability bars)


@dataclass
class Step:
    token: int                   # the token chosen
    prob: float                  # its probability (before temperature, top-k, top-p)
    top_ids: list[int]           # the TOP most probable tokens
    top_probs: list[float]
    attention: torch.Tensor      # [L, H, S]: the predicting query's row over the S tokens so far


@dataclass
class Generation:
    prompt_ids: list[int]
    prompt_tokens: list[str]
    steps: list[Step] = field(default_factory=list)
    stopped: str = "length"      # length | eos | positions | time
    settings: dict = field(default_factory=dict)

    @property
    def ids(self) -> list[int]:
        return [s.token for s in self.steps]

    def text(self, tokenizer) -> str:
        if hasattr(tokenizer, "decode"):
            return tokenizer.decode(self.ids)
        return " ".join(token_names(tokenizer, self.ids))  # the toys' few-symbol tokenizer, or none


def check_settings(temperature: float, top_k: int, top_p: float, max_new: int):
    if not temperature >= 0:
        raise ValueError("temperature must be 0 (greedy) or more")
    if int(top_k) < 0:
        raise ValueError("top-k must be 0 (no cut) or more")
    if not 0 < top_p <= 1:
        raise ValueError("top-p must lie in (0, 1]")
    if not 1 <= int(max_new) <= LIMITS.max_generate_tokens:
        raise ValueError(f"generate between 1 and {LIMITS.max_generate_tokens} tokens")


def pick(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, generator) -> int:
    """The next token from logits [V]: argmax when temperature is 0, else a draw (see the docstring)."""
    if temperature == 0:
        return int(logits.argmax())
    scaled = logits.float() / temperature
    if top_k and top_k < scaled.numel():
        cut = scaled.topk(int(top_k)).values[-1]
        scaled = scaled.masked_fill(scaled < cut, float("-inf"))
    probs = scaled.softmax(-1)
    if top_p < 1:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(0) - sorted_p < top_p                      # the smallest set reaching top_p
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


def _rows(net, weights: dict[int, torch.Tensor], H: int) -> torch.Tensor:
    """Captured weights {layer: (1, h_layer, T, S)} -> the last query's rows [L, H, S] (pruned heads 0)."""
    S = next(iter(weights.values())).shape[-1]
    out = torch.zeros(len(weights), H, S)
    for i, w in weights.items():
        out[i, net.blocks[i].attn.heads] = w[0, :, -1].float()
    return out


def generate(model, prompt, max_new: int = 20, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             seed: int = 0, head_mask=None, ablation: str = "zero", means=None, stop_at_eos: bool = True,
             cancel=None) -> Generation:
    """Up to `max_new` tokens after `prompt` (text or ids); see the module docstring."""
    if not model.next_token:
        raise ValueError(f"{model.info.key} is not a language model: pick SmolLM2, GPT-2 or a toy LM")
    check_settings(temperature, top_k, top_p, max_new)
    mask = model.check_head_mask(head_mask)
    fill = head_ablation.fill(mask, ablation, means)
    inp = model.inputs(prompt)
    ids = inp["ids"]
    net, cfg = model.net, model.cfg
    L = cfg.n_layers
    if len(ids) > LIMITS.readout_max_tokens:
        raise ValueError(f"the prompt has {len(ids):,} tokens; generation takes at most {LIMITS.readout_max_tokens:,}. "
                         "Shorten it.")
    # each step keeps one query's row over every token so far, in every layer
    memory.plan_capture("a generation", layers=L, heads=cfg.n_heads, n=len(ids) + int(max_new), rows=1,
                        copies=int(max_new), shorten="the prompt")
    out = Generation(ids.tolist(), inp["tokens"],
                     settings=dict(max_new=int(max_new), temperature=temperature, top_k=int(top_k), top_p=top_p,
                                   seed=int(seed), ablation=ablation, heads_off=0 if mask is None else int((mask < 1).sum())))
    eos = getattr(model.tokenizer, "eos_token_id", None) if stop_at_eos else None
    generator = torch.Generator().manual_seed(int(seed))
    deadline = jobs.Deadline(LIMITS.max_generate_seconds, "generation")
    cache = [{} for _ in range(L)]
    variants = getattr(model, "variant", None)
    check = jobs.checks(cancel)  # the deadline keeps the steps made: it is read between steps only
    with jobs.heavy_job("a generation"), torch.inference_mode():
        x, offset = net.embed_text(ids[None]), 0
        if x.shape[1] > 1:  # the prompt but its last token: keys and values into the cache, no weights
            net.run_blocks(x[:, :-1], head_mask=mask, head_fill=fill, cache=cache, variants=variants, check=check)
            x, offset = x[:, -1:], x.shape[1] - 1
        while True:
            if cancel is not None:
                cancel.check()
            run = net.run_blocks(x, head_mask=mask, head_fill=fill, capture=range(L), cache=cache, offset=offset,
                                 variants=variants)
            logits = net.finish(run.x[:, -1:])[1][0, -1].float()
            probs = logits.softmax(-1)
            token = pick(logits, temperature, top_k, top_p, generator)
            top_p_, top_i = probs.topk(min(TOP, probs.numel()))
            out.steps.append(Step(token, float(probs[token]), top_i.tolist(), top_p_.tolist(),
                                  _rows(net, run.weights, cfg.n_heads)))
            offset += x.shape[1]
            if eos is not None and token == eos:
                out.stopped = "eos"
                break
            if len(out.steps) >= max_new:
                break
            if offset + 1 > model.max_tokens:
                out.stopped = "positions"
                break
            if deadline.expired():
                out.stopped = "time"
                break
            x = net.embed_text(torch.tensor([[token]]), offset=offset)
    return out


def first_difference(a: Generation, b: Generation) -> int | None:
    """The first step at which two generations chose different tokens (None: they agree throughout
    the steps both have)."""
    for j, (x, y) in enumerate(zip(a.ids, b.ids)):
        if x != y:
            return j
    return None


def steps_frame(gen: Generation, tokenizer=None) -> pd.DataFrame:
    """One row per step: the token chosen, its probability, the top candidates."""
    rows = []
    for j, s in enumerate(gen.steps):
        tops = token_names(tokenizer, s.top_ids)
        rows.append(dict(step=j, position=len(gen.prompt_ids) + j, token=token_names(tokenizer, [s.token])[0],
                         id=s.token, probability=s.prob,
                         candidates=" | ".join(f"{t} {p:.3f}" for t, p in zip(tops, s.top_probs))))
    return pd.DataFrame(rows)


def written_tokens(gen: Generation, tokenizer=None) -> list[str]:
    """Labels of the generated tokens read in context, as the prompt's are: a byte-level piece that
    only starts a character shows that character and "…" (爱…), not its bytes."""
    if not hasattr(tokenizer, "convert_ids_to_tokens"):
        return token_names(tokenizer, gen.ids)   # the toys' few-symbol tokenizer, or none
    return labels(tokenizer, gen.prompt_ids + gen.ids)[0][len(gen.prompt_ids):]


def step_tokens(gen: Generation, tokenizer=None) -> list[str]:
    """Labels of every token a step's attention row covers: the prompt, then the generated ones."""
    return list(gen.prompt_tokens) + written_tokens(gen, tokenizer)[:-1]
