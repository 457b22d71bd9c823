"""Toy transformers on synthetic tasks with exact answers, built from our own modules.

Four tasks, each a prompt followed by an answer the model writes token by token:

    copy     BOS 3 1 4 1 SEP -> 3 1 4 1
    reverse  BOS 3 1 4 1 SEP -> 1 4 1 3
    sort     BOS 3 1 4 1 SEP -> 1 1 3 4
    recall   BOS a 3 b 1 c 4 SEP c -> 4, b -> 1, a -> 3   (multi-query associative recall,
             MQAR of Arora et al. 2023: solved by induction heads)

Every answer token comes from one known prompt position (its *source*), so head specialisation
is measurable exactly: how much weight the answering query puts on the source, and how much each
position puts on the token just before it (previous-token heads).

The models are `Config` + `Transformer` (a GPT-2-style causal decoder) trained here in well under
a minute on two cores (`toy_training.py`); shipped checkpoints live in `data/toys/` (float16
safetensors + JSON) and are reproduced by `scripts/train_toys.py`.
"""
from __future__ import annotations

import json
import re
import string
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from importlib.resources import files

import torch

from attnviz.core.base_model import ModelInfo
from attnviz.core.model import Model
from attnviz.core.attention import parse_variant
from attnviz.core.config import Config
from attnviz.core.transformer import Transformer

TASKS = {
    "copy": "repeat the digits in the same order",
    "reverse": "repeat the digits backwards",
    "sort": "repeat the digits in ascending order",
    "recall": "key-value pairs, then every key again: answer its value (multi-query associative "
              "recall, solved by induction heads)",
}
BOS, SEP = 0, 1
SPECIALS = ["BOS", "SEP"]
EVAL_SEED, EVAL_SIZE = 1234, 2000  # the fixed held-out set every stated accuracy refers to
TOY_DIR = files("attnviz") / "data" / "toys"
POSITIONALS = ("learned", "rotary", "sinusoidal", "none")


@dataclass(frozen=True)
class Task:
    name: str = "copy"
    length: int = 8       # digits to copy / reverse / sort, or key-value pairs to recall
    n_symbols: int = 10   # value alphabet: digits 0..n_symbols-1
    n_keys: int = 16      # recall only: key alphabet a, b, c, ...

    def __post_init__(self):
        if self.name not in TASKS:
            raise ValueError(f"unknown task {self.name!r}; choose one of {', '.join(TASKS)}")
        if not 2 <= self.length <= 16:
            raise ValueError("task length must be between 2 and 16")
        if not 2 <= self.n_symbols <= 10:
            raise ValueError("the digit alphabet must have between 2 and 10 symbols")
        if self.name == "recall" and not self.length <= self.n_keys <= 26:
            raise ValueError(f"recall needs at least as many keys as pairs ({self.length}) and at most 26")

    @property
    def vocab(self) -> list[str]:
        keys = list(string.ascii_lowercase[: self.n_keys]) if self.name == "recall" else []
        return SPECIALS + [str(i) for i in range(self.n_symbols)] + keys

    @property
    def seq_len(self) -> int:
        """Model input length: the whole sequence but its last token."""
        return 4 * self.length + 1 if self.name == "recall" else 2 * self.length + 1

    @property
    def answer_positions(self) -> list[int]:
        """Input positions whose next-token prediction is an answer token."""
        n = self.length
        if self.name == "recall":  # BOS k1 v1 .. kn vn SEP q1 a1 q2 a2 ...: each q predicts its a
            return [2 * n + 2 + 2 * i for i in range(n)]
        return [n + 1 + i for i in range(n)]  # BOS x1 .. xn SEP y1 ..: SEP predicts y1, ...

    def sample(self, batch: int, generator: torch.Generator | None = None):
        """(inputs [B, seq_len], answers [B, n], sources [B, n]): `sources` are the input
        positions each answer is copied from."""
        B, n, digit0 = batch, self.length, len(SPECIALS)
        if self.name == "recall":
            keys = torch.rand(B, self.n_keys, generator=generator).argsort(-1)[:, :n] + digit0 + self.n_symbols
            values = torch.randint(0, self.n_symbols, (B, n), generator=generator) + digit0
            asked = torch.rand(B, n, generator=generator).argsort(-1)     # which pair each query asks
            pairs = torch.stack([keys, values], -1).reshape(B, 2 * n)     # k1 v1 k2 v2 ...
            answers = values.gather(1, asked)
            queries = torch.stack([keys.gather(1, asked), answers], -1).reshape(B, 2 * n)
            full = torch.cat([_col(B, BOS), pairs, _col(B, SEP), queries], 1)
            return full[:, :-1], answers, 2 + 2 * asked                   # the value after the key
        x = torch.randint(0, self.n_symbols, (B, n), generator=generator) + digit0
        if self.name == "sort":
            order = x.argsort(dim=-1, stable=True)
        else:
            order = torch.arange(n).expand(B, n)
            order = order.flip(-1) if self.name == "reverse" else order
        answers = x.gather(1, order)
        full = torch.cat([_col(B, BOS), x, _col(B, SEP), answers], 1)
        return full[:, :-1], answers, 1 + order

    def example_prompt(self) -> str:
        digits = [str(int(c) % self.n_symbols) for c in "3141592653589793"[: self.length]]
        if self.name != "recall":
            return "".join(digits)
        keys = string.ascii_lowercase[: self.length]
        return " ".join(k + d for k, d in zip(keys, digits)) + " | " + keys[::-1]

    def prompt(self, text: str) -> tuple[list[int], list[int]]:
        """A user's prompt -> (ids the model reads first, recall queries). Copy, reverse, sort:
        '31415926'; recall: pairs, '|', then the keys to ask: 'a3 b1 c4 | c a'."""
        ids = ToyTokenizer(self)(text)["input_ids"]
        digits = set(range(len(SPECIALS), len(SPECIALS) + self.n_symbols))
        if self.name != "recall":
            body = [i for i in ids if i not in (BOS, SEP)]
            if len(body) != self.length or any(t not in digits for t in body):
                raise ValueError(f"this toy expects {self.length} digits from 0 to {self.n_symbols - 1}, "
                                 f"e.g. {self.example_prompt()}")
            return [BOS] + body + [SEP], []
        if SEP not in ids:
            raise ValueError(f"write the pairs, then '|', then the keys to ask, e.g. {self.example_prompt()}")
        cut = ids.index(SEP)
        pairs, queries = ids[1:cut], ids[cut + 1:]
        keys, values = pairs[0::2], pairs[1::2]
        if len(pairs) != 2 * self.length or any(k in digits for k in keys) or any(v not in digits for v in values):
            raise ValueError(f"this toy expects {self.length} key-digit pairs, e.g. {self.example_prompt()}")
        if len(set(keys)) != len(keys):
            raise ValueError("keys must be distinct")
        if not 1 <= len(queries) <= self.length or any(q not in keys for q in queries):
            raise ValueError(f"after '|' ask 1 to {self.length} of the keys given")
        return [BOS] + pairs + [SEP], queries

    def solve(self, ids: list[int], queries: list[int]) -> list[int]:
        """The exact answer for a prompt made by `prompt`."""
        if self.name == "recall":
            pairs = ids[1:-1]
            table = dict(zip(pairs[0::2], pairs[1::2]))
            return [table[q] for q in queries]
        x = ids[1:-1]
        return {"copy": x, "reverse": x[::-1], "sort": sorted(x)}[self.name]


def _col(B: int, token: int) -> torch.Tensor:
    return torch.full((B, 1), token, dtype=torch.long)


class ToyTokenizer:
    """Just enough of a tokenizer for `Model.trace(str)` and readable token labels."""

    def __init__(self, task: Task):
        self.vocab = task.vocab
        self.index = {t: i for i, t in enumerate(self.vocab)}
        self.index["|"] = SEP
        self.all_special_ids = [BOS, SEP]

    def __call__(self, text: str, truncation: bool = False, max_length: int | None = None):
        pieces = re.findall(r"BOS|SEP|\S", text)
        unknown = sorted({p for p in pieces if p not in self.index})
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))} not in this toy's vocabulary: "
                             f"{' '.join(self.vocab)} (and '|' for SEP)")
        ids = [self.index[p] for p in pieces]
        ids = ids if ids[:1] == [BOS] else [BOS] + ids
        return {"input_ids": ids[:max_length] if truncation and max_length else ids}

    def convert_ids_to_tokens(self, ids):
        return [self.vocab[i] for i in ids]


def toy_config(task: Task, n_layers: int = 2, n_heads: int = 4, d_model: int = 64,
               positional: str = "learned") -> Config:
    if positional not in POSITIONALS:
        raise ValueError(f"positional must be one of {', '.join(POSITIONALS)}")
    if n_heads < 1 or d_model % n_heads:
        raise ValueError(f"d_model ({d_model}) must be a multiple of the number of heads ({n_heads})")
    if positional == "rotary" and (d_model // n_heads) % 2:
        raise ValueError("rotary positions need an even head width; change d_model or the heads")
    if not 1 <= n_layers <= 8:
        raise ValueError("toy models have 1 to 8 layers")
    return Config(family="gpt2", task="lm", n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_heads,
                  d_model=d_model, d_head=d_model // n_heads, d_ff=2 * d_model,
                  vocab_size=len(task.vocab), max_positions=task.seq_len, norm_eps=1e-5,
                  positional=positional, causal=True, pre_norm=True)


class ToyModel(Model):
    """A Model that knows its task and the attention variant it was trained with."""

    def __init__(self, net: Transformer, info: ModelInfo, task: Task, variant: str = "softmax"):
        super().__init__(net, info, ToyTokenizer(task))
        self.task, self.variant = task, parse_variant(variant)


# ---------------------------------------------------------------- evaluation
@dataclass(frozen=True)
class Score:
    exact: float   # answers entirely right (greedy decoding gives the same answer)
    token: float   # answer tokens right
    n: int


def answer_logits(model: ToyModel, inputs: torch.Tensor, head_mask=None, need_weights=False):
    """Logits at the positions that predict the answer: (B, A, vocab), plus captured weights."""
    return _answer_logits(model.net, model.task, model.variant, inputs, head_mask, need_weights)


def _answer_logits(net, task: Task, variant, inputs, head_mask=None, need_weights=False):
    with torch.inference_mode():
        out = net(input_ids=inputs, head_mask=head_mask, need_weights=need_weights, variants=variant)
    return out.logits[:, task.answer_positions], out.attentions


def score(net, task: Task, variant, head_mask=None, n: int = EVAL_SIZE, seed: int = EVAL_SEED) -> Score:
    """Exact accuracy of a bare network (also mid-training) on the fixed held-out set. With
    teacher forcing, an answer whose every token is the argmax is exactly the answer greedy
    decoding writes."""
    inputs, answers, _ = task.sample(n, torch.Generator().manual_seed(seed))
    variant = parse_variant(variant)
    right = torch.cat([_answer_logits(net, task, variant, inputs[i:i + 500], head_mask)[0].argmax(-1)
                       == answers[i:i + 500] for i in range(0, n, 500)])
    return Score(exact=right.all(1).float().mean().item(), token=right.float().mean().item(), n=n)


def evaluate(model: ToyModel, head_mask=None, n: int = EVAL_SIZE, seed: int = EVAL_SEED) -> Score:
    """Exact accuracy of a toy model, optionally with heads switched off ([L, H], 0 = off)."""
    if head_mask is not None:
        head_mask = model.check_head_mask(head_mask)
    return score(model.net, model.task, model.variant, head_mask, n, seed)


def complete(model: ToyModel, prompt_text: str) -> tuple[list[str], list[str]]:
    """Greedy answer to a user's prompt, and the exact answer, as symbols."""
    ids, queries = model.task.prompt(prompt_text)
    truth = model.task.solve(ids, queries)
    written = []
    for step in range(len(truth)):
        if queries:  # recall: the prompt supplies each key, the model writes its value
            ids.append(queries[step])
        with torch.inference_mode():
            logits = model.net(input_ids=torch.tensor([ids]), variants=model.variant).logits
        written.append(int(logits[0, -1].argmax()))
        ids.append(written[-1])
    vocab = model.task.vocab
    return [vocab[i] for i in written], [vocab[i] for i in truth]


def head_scores(model: ToyModel, n: int = 256, seed: int = EVAL_SEED) -> dict[str, torch.Tensor]:
    """[L, H] scores in [0, 1]: `source`, the mean weight the answering query puts on the prompt
    position its answer comes from (copy / induction heads); `previous`, the mean weight each
    position puts on the one just before it (previous-token heads)."""
    inputs, _, sources = model.task.sample(n, torch.Generator().manual_seed(seed))
    _, att = answer_logits(model, inputs, need_weights=True)
    A = torch.stack([att[i] for i in range(model.cfg.n_layers)])        # (L, B, H, T, T)
    rows = A[:, :, :, model.task.answer_positions, :]                   # (L, B, H, A, T)
    index = sources[None, :, None, :, None].expand(*rows.shape[:4], 1)
    on_source = rows.gather(-1, index)[..., 0]                          # (L, B, H, A)
    T = inputs.shape[1]
    prev = A[..., torch.arange(1, T), torch.arange(T - 1)]               # (L, B, H, T-1)
    return {"source": on_source.mean((1, 3)), "previous": prev.mean((1, 3))}


def example(model: ToyModel, seed: int = 7):
    """One held-out example: token labels and every head's attention [L, H, T, T]."""
    inputs, _, _ = model.task.sample(1, torch.Generator().manual_seed(seed))
    tr = model.trace(inputs[0], variants=model.variant)
    return tr.tokens, tr.attentions


def ablation_importance(model: ToyModel, n: int = 1000) -> torch.Tensor:
    """[L, H]: exact accuracy lost when that head alone is switched off."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    base = evaluate(model, n=n).exact
    drop = torch.zeros(L, H)
    for layer in range(L):
        for head in range(H):
            mask = torch.ones(L, H)
            mask[layer, head] = 0
            drop[layer, head] = base - evaluate(model, mask, n=n).exact
    return drop


def pruning_curve(model: ToyModel, n: int = 1000, importance: torch.Tensor | None = None) -> list[dict]:
    """Switch heads off one by one, least important first; exact accuracy after each."""
    importance = ablation_importance(model, n) if importance is None else importance
    L, H = importance.shape
    order = sorted(range(L * H), key=lambda i: (float(importance.flatten()[i]), i))
    mask = torch.ones(L, H)
    rows = [dict(pruned=0, head="", exact=evaluate(model, mask, n=n).exact)]
    for k, flat in enumerate(order, start=1):
        mask[flat // H, flat % H] = 0
        rows.append(dict(pruned=k, head=f"L{flat // H}H{flat % H}", exact=evaluate(model, mask, n=n).exact))
    return rows


# ---------------------------------------------------------------- shipped checkpoints
def _read_index() -> dict[str, dict]:
    if not TOY_DIR.is_dir():
        return {}
    metas = (json.loads(p.read_text()) for p in TOY_DIR.iterdir() if p.name.endswith(".json"))
    return {m["key"]: m for m in sorted(metas, key=lambda m: m["key"])}


TOYS: dict[str, dict] = _read_index()  # key -> metadata (task, settings, config, stated accuracy)


def toy_info(meta: dict, params: int = 0) -> ModelInfo:
    cfg = meta["config"]
    acc = meta.get("accuracy", {}).get("exact")
    stated = f", exact accuracy {acc:.1%}" if acc is not None else ""
    return ModelInfo(key=meta["key"], family=cfg["family"], task=cfg["task"], n_layers=cfg["n_layers"],
                     n_heads=cfg["n_heads"], n_kv_heads=cfg["n_kv_heads"],
                     max_positions=cfg["max_positions"], params=params, licence="project licence",
                     size_mb=round(meta.get("size_bytes", 0) / 1e6, 2),
                     source=f"toy transformer, {meta['task']['name']} task{stated} (scripts/train_toys.py)")


def toy_infos() -> list[ModelInfo]:
    return [toy_info(m, m.get("params", 0)) for m in TOYS.values()]


def config_from_dict(d: dict) -> Config:
    d = dict(d)
    for name in ("head_dims", "kv_dims"):
        if d.get(name) is not None:
            d[name] = tuple(d[name])
    return Config(**d)


def load_toy(key: str) -> ToyModel:
    """A shipped toy checkpoint (safetensors, float16 on disk, float32 in memory)."""
    if key not in TOYS:
        raise ValueError(f"unknown toy {key!r}; shipped toys: {', '.join(TOYS) or 'none'}")
    return _load_toy(key)


@lru_cache(maxsize=8)
def _load_toy_state(key: str) -> dict:
    from safetensors.torch import load
    return load((TOY_DIR / f"{key}.safetensors").read_bytes())


def _load_toy(key: str) -> ToyModel:
    meta = TOYS[key]
    cfg = config_from_dict(meta["config"])
    net = Transformer(cfg)
    net.load_state_dict({k: v.float() for k, v in _load_toy_state(key).items()})
    model = ToyModel(net, toy_info(meta), Task(**meta["task"]), meta["settings"].get("variant", "softmax"))
    model.info = replace(model.info, params=model.num_params())
    return model


def save_toy(model: ToyModel, key: str, folder, meta: dict) -> dict:
    """Write `key`.safetensors (float16) and `key`.json into `folder`; returns the metadata."""
    from pathlib import Path

    from safetensors.torch import save_file
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.net.state_dict().items()}
    save_file(state, str(folder / f"{key}.safetensors"))
    (folder / f"{key}.safetensors").chmod(0o644)  # package data: readable by every user
    meta = dict(meta, key=key, task=asdict(model.task), config=asdict(model.cfg),
                params=model.num_params(),
                size_bytes=(folder / f"{key}.safetensors").stat().st_size)
    (folder / f"{key}.json").write_text(json.dumps(meta, indent=1))
    return meta
