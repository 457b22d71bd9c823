"""The guided walk through one head: one query token followed from Q·Kᵀ to the head's output.

`guide(result, query)` reads the matrices `head_recompute.head_steps` computed (nothing is recomputed, so
every number is exactly the model's) and gives, for each step, the query's row, the key that
stands out in it, and one plain sentence on what to look at, written from those numbers.
`opening_head(model, ids)` picks the head a first walk opens on: the one where the followed
pronoun ("it") gives the most weight to the noun it refers to ("animal").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnviz.analysis.head_recompute import HeadSteps
from attnviz.analysis.head_ranking import rank_heads
from attnviz.core.model import Model
from attnviz.core.tokens import LEADING_SPACE_MARKS, show

# (HeadSteps step key, short title) in the order the walk takes them
GUIDE = (("scores", "Q·Kᵀ scores"), ("scaled", "scale"), ("masked", "mask"),
         ("softmax", "softmax"), ("weighted", "weights · V"), ("output", "W_O: the head's output"))
PRONOUNS = ("it", "its", "she", "he", "her", "him", "they", "them", "their")  # tokens worth following
TOP_SHARE_KEYS = 3      # "the top 3 keys take …": enough to say whether a head is peaked or spread
# The pronoun and the noun it refers to in the default sentence ("… the animal … because it was
# too tired"): the pair the first walk opens on, as the Attention page's Find heads does.
REFERENT = ("it", "animal")


@dataclass
class Contribution:
    key: int                # key position j
    weight: float           # A[q, j]
    share: float            # (A[q, j] V[j]) · z / (z · z): the parts along z, adding up to 1
    vector: torch.Tensor    # (d_head,) A[q, j] V[j]


@dataclass
class GuideStep:
    key: str                # the HeadSteps step shown ("scores" … "output")
    title: str
    sentence: str           # one sentence on what to look at, from the numbers
    row: torch.Tensor       # the query's row of that step (n keys; d_head or d_model for the last two)
    over: str               # what the row runs over: "keys", "d_head" or "d_model"
    top: int                # the entry to emphasise: argmax key, largest contributor, largest |entry|
    masked: list[int]       # key positions the query may not see


def is_special(token: str) -> bool:
    """[CLS], [SEP], <s>, <|endoftext|>: markers, not words."""
    t = token.strip()
    return len(t) > 2 and ((t[0] == "[" and t[-1] == "]") or (t[0] == "<" and t[-1] == ">"))


def word(token: str) -> str:
    """A token as a sentence quotes it: the leading-space mark dropped, whitespace made visible."""
    for mark in LEADING_SPACE_MARKS:
        if token.startswith(mark) and len(token) > len(mark):
            token = token[len(mark):]
    return show(token)


def default_query(tokens: list[str]) -> int:
    """A token worth following: the first pronoun ("it" in "… because it was too tired"), else the
    last word that is not a marker or punctuation, else the last token."""
    words = [word(t).lower() for t in tokens]
    for i, w in enumerate(words):
        if w in PRONOUNS:
            return i
    for i in range(len(tokens) - 1, -1, -1):
        if not is_special(tokens[i]) and any(ch.isalnum() for ch in words[i]):
            return i
    return len(tokens) - 1


@dataclass
class OpeningHead:
    layer: int
    head: int
    weight: float           # A[layer, head, query, key]: the largest over every head
    query: int              # position of the pronoun ("it"), the token the walk follows
    key: int                # position of the noun it refers to ("animal")
    tokens: list[str]


def referent_pair(tokens: list[str], pair: tuple[str, str] = REFERENT) -> tuple[int, int] | None:
    """(query, key): the followed token (`default_query`) when it is the pronoun of ``pair``, and
    the last occurrence of the noun before it; None when the text has no such pair."""
    words = [word(t).lower() for t in tokens]
    query = default_query(tokens)
    pronoun, noun = pair
    nouns = [j for j in range(query) if words[j] == noun]
    return (query, nouns[-1]) if words[query] == pronoun and nouns else None


def opening_head(model: Model, ids: torch.Tensor) -> OpeningHead | None:
    """The head where the pronoun gives the noun it refers to the most weight, read from one trace
    of every layer (`stats.rank_heads`: ties go to the lower layer, then head); None, with no
    trace run, when the tokens of ``ids`` hold no such pair (then a walk opens on L0H0)."""
    tokens = model.inputs(ids)["tokens"]
    pair = referent_pair(tokens)
    if pair is None:
        return None
    attentions = model.trace(ids).attentions                         # (L, H, n, n), every layer
    top = rank_heads(attentions, *pair, causal=model.cfg.causal, by="weight").iloc[0]
    return OpeningHead(int(top["layer"]), int(top["head"]), float(top["weight"]), *pair, tokens)


def quoted(tokens: list[str], i: int, query: int | None = None) -> str:
    """‘animal’; a token that occurs more than once also gets its position: ‘the’ at position 7;
    the query's own position reads ‘it’ itself."""
    if i == query:
        return quoted(tokens, i) + " itself"
    w = word(tokens[i])
    again = sum(word(t) == w for t in tokens) > 1
    return f"‘{w}’" + (f" at position {i}" if again else "")


def masked_keys(result: HeadSteps, query: int) -> list[int]:
    return (result.steps["mask"].value[query] == 0).nonzero().flatten().tolist()


def contributions(result: HeadSteps, query: int) -> list[Contribution]:
    """The query's output z = Σ_j A[q, j] V[j], split into its parts, largest share first. A part's
    share is its length along z (projection / |z|²), so the shares add up to 1 exactly as the
    vectors add up to z (up to rounding); a part pointing against z has a negative share."""
    a = result.steps["softmax"].value[query]                   # (n,)
    parts = a[:, None] * result.steps["V"].value                # (n, d_head)
    z = result.steps["weighted"].value[query]                   # (d_head,)
    zz = float(z @ z) or 1.0                                    # z = 0 only if every V row is 0
    out = [Contribution(j, float(a[j]), float(parts[j] @ z) / zz, parts[j]) for j in range(len(a))]
    return sorted(out, key=lambda c: -c.share)


def sum_error(result: HeadSteps, query: int) -> float:
    """max |Σ_j A[q, j] V[j] − z[q]|: the parts add up to the output row the model computes."""
    parts = sum(c.vector for c in contributions(result, query))
    return float((parts - result.steps["weighted"].value[query]).abs().max())


def top_share(row: torch.Tensor, k: int = TOP_SHARE_KEYS) -> float:
    return float(row.topk(min(k, len(row))).values.sum())


def argmax(row: torch.Tensor) -> int:
    return int(row.argmax())


def spread(row: torch.Tensor) -> float:
    """max − min over the finite entries (masked −∞ left out)."""
    finite = row[torch.isfinite(row)]
    return float(finite.max() - finite.min())


def listed(tokens: list[str], keys: list[int], at_most: int = 4) -> str:
    names = [quoted(tokens, j) for j in keys[:at_most]]
    more = len(keys) - at_most
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


def step_sentences(result: HeadSteps, query: int) -> dict[str, tuple[str, torch.Tensor, int]]:
    """{step key: (sentence, the query's row, the entry to emphasise)} for every step of GUIDE."""
    tokens, st = result.tokens, result.steps
    q, n = quoted(tokens, query), len(tokens)
    d_head, d_model = st["Q"].value.shape[1], st["output"].value.shape[1]
    masked = masked_keys(result, query)
    out = {}

    row = st["scores"].value[query]
    hi, lo = argmax(row), int(row.argmin())
    out["scores"] = (f"Follow the row of {q}: its query vector matches the key of "
                     f"{quoted(tokens, hi, query)} best ({row[hi]:.2f}) and {quoted(tokens, lo, query)} "
                     f"least ({row[lo]:.2f}); these are "
                     "raw dot products, not weights yet.", row, hi)

    row = st["scaled"].value[query]
    t = result.temperature
    by = f"√{d_head} = {math.sqrt(d_head):.2f}" + (f", then by the temperature {t:g}" if t != 1 else "")
    before, after = spread(st["scores"].value[query]), spread(row)
    peaked = "shrinks" if after <= before else "grows"
    out["scaled"] = (f"Every score is divided by {by}: {quoted(tokens, hi, query)} still leads "
                     f"({st['scores'].value[query, hi]:.2f} → {row[hi]:.2f}), and the row's spread "
                     f"{peaked} from {before:.2f} to {after:.2f}, so softmax will be "
                     f"{'less' if after <= before else 'more'} peaked than on the raw scores.", row, hi)
    if "position_bias" in st:  # a bias by distance can change which key leads
        lead = argmax(row)
        out["scaled"] = (f"Every score is divided by {by}, then the head adds its bias for each "
                         f"query-key distance: {quoted(tokens, lead, query)} now leads ({row[lead]:.2f}), "
                         f"and the row's spread is {after:.2f} (it was {before:.2f}).", row, lead)

    row = st["masked"].value[query]
    best = argmax(row)
    if masked:
        out["masked"] = (f"{len(masked)} of {n} keys are masked for {q} ({listed(tokens, masked)}): "
                         "their scores become −∞, so softmax will give them exactly 0; the best "
                         f"score left is {quoted(tokens, best, query)} ({row[best]:.2f}).", row, best)
    else:
        out["masked"] = (f"Nothing is masked for {q}: all {n} scores pass unchanged (a masked key "
                         "would become −∞ and get exactly 0 weight after softmax).", row, best)

    row = st["softmax"].value[query]
    best = argmax(row)
    zero = "; the masked keys get exactly 0" if masked and bool((row[masked] == 0).all()) else ""
    special = " (a marker token: heads often park spare weight there)" if is_special(tokens[best]) else ""
    out["softmax"] = (f"After softmax, {row[best]:.2f} of the attention of {q} goes to "
                      f"{quoted(tokens, best, query)}{special}; the top {min(TOP_SHARE_KEYS, n)} keys take "
                      f"{top_share(row):.2f} and the row sums to {float(row.sum()):.3f}{zero}.", row, best)

    parts = contributions(result, query)
    first = parts[0]
    then = f", then {quoted(tokens, parts[1].key, query)} ({parts[1].share:.0%})" if len(parts) > 1 else ""
    out["weighted"] = (f"The output z of {q} is the weighted sum of the value rows: "
                       f"{quoted(tokens, first.key, query)} (weight {first.weight:.2f}) contributes the most, "
                       f"{first.share:.0%} of z{then}; the {n} parts add up to z "
                       f"(max |Σ − z| = {sum_error(result, query):.1g}).",
                       torch.tensor([c.share for c in sorted(parts, key=lambda c: c.key)]), first.key)

    row = st["output"].value[query]
    big = int(row.abs().argmax())
    out["output"] = (f"W_O turns the {d_head} numbers of z into {d_model} (length "
                     f"{float(row.norm()):.2f}, largest |entry| {row[big].abs():.2f} in dimension "
                     f"{big}) that head {result.head} adds to the residual stream of {q}, with the other "
                     "heads' outputs.", row, big)
    return out


def guide(result: HeadSteps, query: int) -> list[GuideStep]:
    """The walk for one query position: one GuideStep per entry of GUIDE."""
    n = len(result.tokens)
    if not 0 <= query < n:
        raise ValueError(f"query position {query} is outside 0..{n - 1}: pick a token of this sentence")
    said, masked = step_sentences(result, query), masked_keys(result, query)
    over = {"output": "d_model"}
    return [GuideStep(k, title, said[k][0], said[k][1], over.get(k, "keys"), said[k][2], masked)
            for k, title in GUIDE]
