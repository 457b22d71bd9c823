"""Translation by a decoder-only language model: a few-shot prompt ("English: …\\nChinese: …"), the
continuation it writes, and where the query that wrote each target token looked among the source
sentence's words.

This is the decoder's self-attention over one sequence (the examples, the source sentence, and what
it has written so far): no separate encoder, no cross-attention. A step's row is the attention of
the query that predicted the token (`generation.Step.attention`), the same query an
encoder-decoder's cross-attention row belongs to; only its weight on the source sentence's words
is read here (summed over each word's tokens), so the rows need not sum to 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from attnviz.analysis import alignment
from attnviz.analysis import generation
from attnviz.core import tokens

# Two examples before the sentence: with one, Gemma 3 270M answers "I love you." with 你好。
EXAMPLES = (("Good morning.", "早上好。"), ("Thank you very much.", "非常感谢。"))
LANGUAGES = ("English", "Chinese")
MAX_NEW = 16   # target tokens at most: a short sentence's translation and its line break


def few_shot_prompt(sentence: str, examples=EXAMPLES, languages=LANGUAGES) -> str:
    """The prompt: each example as two labelled lines, then the sentence and the open target label."""
    source, target = languages
    sentence = " ".join(sentence.split())
    if not sentence:
        raise ValueError("type a sentence to translate")
    shots = "".join(f"{source}: {s}\n{target}: {t}\n" for s, t in examples)
    return f"{shots}{source}: {sentence}\n{target}:"


@dataclass
class PromptTranslation:
    prompt: str
    text: str                       # the continuation, up to the end of its line
    prompt_tokens: list[str]
    source_words: list[str]         # the sentence's words (the last source line of the prompt)
    source_groups: list[list[int]]  # each word's token positions in the prompt
    target_tokens: list[str]        # labels of the tokens written, up to the line break
    rows: torch.Tensor              # [n_target, L, H, n_words]: each writing query's weight on each word

    def best_head(self, target: int) -> tuple[int, int, int]:
        """(layer, head, word) of the head that puts the most weight on a single source word while
        writing target token ``target`` (ties: the lower layer, head, word)."""
        flat = self.rows[target].reshape(-1)
        at = int(flat.argmax())
        n_heads, n_words = self.rows.shape[2], self.rows.shape[3]
        return at // (n_heads * n_words), at // n_words % n_heads, at % n_words

    def per_layer(self, target: int) -> pd.DataFrame:
        """One row per layer: its head with the most weight on one source word, that word and
        weight, and the weight that head puts on each word."""
        records = []
        for layer, weights in enumerate(self.rows[target]):          # (H, n_words)
            head = int(weights.max(-1).values.argmax())
            row = weights[head]
            records.append({"layer": layer, "head": head, "word": self.source_words[int(row.argmax())],
                            "weight": float(row.max()),
                            **{w: float(v) for w, v in zip(self.word_columns(), row)}})
        return pd.DataFrame.from_records(records)

    def word_columns(self) -> list[str]:
        """The source words as distinct column names ("you", "you (2)")."""
        seen: dict[str, int] = {}
        out = []
        for w in self.source_words:
            seen[w] = seen.get(w, 0) + 1
            out.append(w if seen[w] == 1 else f"{w} ({seen[w]})")
        return out

    def target_holding(self, char: str) -> int | None:
        """The first target token whose label completes ``char`` (爱 inside Gemma's 爱你)."""
        return next((i for i, t in enumerate(self.target_tokens) if char in tokens.completed(t)), None)


def translate(model, sentence: str, examples=EXAMPLES, languages=LANGUAGES, max_new: int = MAX_NEW,
              cancel=None) -> PromptTranslation:
    """Greedy continuation of the few-shot prompt for ``sentence``, cut at its line break."""
    prompt = few_shot_prompt(sentence, examples, languages)
    gen = generation.generate(model, prompt, max_new, cancel=cancel)
    written = generation.written_tokens(gen, model.tokenizer)
    end = next((i for i, t in enumerate(written) if "↵" in t), len(written))
    source_at = _source_positions(gen.prompt_tokens, languages[0])
    words, groups = alignment.word_groups([gen.prompt_tokens[i] for i in source_at])
    groups = [[source_at[i] for i in g] for g in groups]
    rows = torch.stack([torch.stack([step.attention[..., g].sum(-1) for g in groups], -1)
                        for step in gen.steps[:end]]) if end else torch.zeros(0, model.cfg.n_layers, model.cfg.n_heads, len(groups))
    text = model.tokenizer.decode(gen.ids[:end]).strip()
    return PromptTranslation(prompt, text, gen.prompt_tokens, [w.lstrip("".join(tokens.LEADING_SPACE_MARKS)) for w in words], groups,
                             written[:end], rows)


def _source_positions(prompt_tokens: list[str], source: str) -> list[int]:
    """Token positions of the sentence: after the last "<source>:" label, up to its line break."""
    labels = [t.lstrip("".join(tokens.LEADING_SPACE_MARKS)) for t in prompt_tokens]
    starts = [i + 2 for i in range(len(labels) - 1) if labels[i] == source and labels[i + 1] == ":"]
    if not starts:
        raise ValueError(f"the prompt has no “{source}:” line this tokenizer keeps whole")
    end = next((i for i in range(starts[-1], len(labels)) if "↵" in prompt_tokens[i]), len(labels))
    return list(range(starts[-1], end))


@dataclass
class CrossRows:
    """An encoder-decoder translation's cross-attention read the same way: each target token's
    weight on each source word, per decoder layer and head."""
    text: str                       # the translation
    source_words: list[str]
    target_tokens: list[str]
    target_words: list[str]         # the word each target token belongs to ("amo" for "mo")
    rows: torch.Tensor              # [n_target, L, H, n_words]

    def strongest_on(self, word: str) -> tuple[int, int, int, float] | None:
        """(target, layer, head, weight): the target token and head that put the most weight on
        source word ``word`` among the targets whose strongest head looks at that word most."""
        if word not in self.source_words:
            return None
        w = self.source_words.index(word)
        best = None
        for t in range(self.rows.shape[0]):
            flat = self.rows[t].reshape(-1, self.rows.shape[-1])       # (L*H, n_words)
            at = int(flat.max(-1).values.argmax())
            if int(flat[at].argmax()) == w and (best is None or float(flat[at, w]) > best[3]):
                best = (t, at // self.rows.shape[2], at % self.rows.shape[2], float(flat[at, w]))
        return best


def cross_rows(translation) -> CrossRows:
    """`CrossRows` of a `Translation` (``model.translate``): source pieces summed into words."""
    words, groups = alignment.word_groups(translation.source_tokens)
    cross = translation.cross_attentions                                 # (L, H, n_tgt, n_src)
    rows = torch.stack([cross[..., g].sum(-1) for g in groups], -1).permute(2, 0, 1, 3)
    t_words, t_groups = alignment.word_groups(translation.target_tokens)
    owner = {i: t_words[n] for n, g in enumerate(t_groups) for i in g}
    strip = "".join(tokens.LEADING_SPACE_MARKS)
    return CrossRows(translation.text, [w.lstrip(strip) for w in words], list(translation.target_tokens),
                     [owner[i].lstrip(strip) for i in range(len(translation.target_tokens))], rows)
