"""Readable token labels: byte-level BPE pieces shown as text, CJK and emoji intact, no mojibake.

A byte-level tokenizer (GPT-2, SmolLM2) may split one character's UTF-8 bytes over several
tokens. Each label holds the characters its token completes; a token that only starts (or
continues) a character adds that character and a trailing '…' (PARTIAL), so no label is ever a
broken byte sequence and Chinese reads as characters: 苹果 is "苹…", "苹…", "苹", "果".
"""
from __future__ import annotations

import bisect
import codecs
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

# A label shows the characters its token spells. A word-initial space stays a plain space
# (" love"): plotly axes and tables draw it as nothing, so the word reads as itself, and code can
# still tell a word start. Any other whitespace is drawn with a symbol, so a token of whitespace
# only is never blank: "␣" (open box, the usual sign for a typed space) for a space, ↵ for a
# newline, ⇥ for a tab. The tokenizers' own marks (SentencePiece's ▁, byte-level BPE's Ġ) are
# never shown.
WORD_SPACE = " "
SPACE_SYMBOL = "␣"
# The one table of whitespace symbols: token labels, figure axes and exports all show these.
WHITESPACE_SYMBOLS = {" ": SPACE_SYMBOL, "\n": "↵", "\r": "⏎", "\t": "⇥"}
# How a label, a raw piece or a typed token starts with a space: the labels' plain space, the
# symbol of a whitespace-only label, and the raw marks of SentencePiece and byte-level BPE (read
# when typed or found in a vocabulary, never written into a label).
LEADING_SPACE_MARKS = (WORD_SPACE, SPACE_SYMBOL, "▁", "Ġ")
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(text: str) -> str:
    """`text` if every character is valid Unicode; a ValueError saying what to do when it holds a
    lone surrogate (half of a UTF-16 pair, e.g. from a cut emoji), which no tokenizer can encode."""
    found = _SURROGATE.search(text)
    if found:
        raise ValueError(f"the text holds an invalid character (a lone surrogate, U+{ord(found.group()):04X}, "
                         f"at character {found.start() + 1:,}), e.g. half of an emoji cut in two; "
                         "delete it or paste the text again from its source")
    return text


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte -> printable-character table (fixed by the byte-level BPE format;
    transformers 5 no longer exports it from a stable place)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def tokenizer_kind(tokenizer) -> str:
    """'bytelevel', 'sentencepiece' or 'wordpiece', from the fast tokenizer's decoder."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and hasattr(tokenizer, "id_to_token"):   # a `tokenizers.Tokenizer` itself
        backend = tokenizer
    decoder = type(getattr(backend, "decoder", None)).__name__ if backend is not None else ""
    text = repr(getattr(backend, "decoder", ""))
    if "ByteLevel" in decoder or "ByteLevel" in text:
        return "bytelevel"
    if "WordPiece" in decoder or "WordPiece" in text:
        return "wordpiece"
    return "sentencepiece"


def show(text: str) -> str:
    """Make whitespace, control and invisible characters visible; leave every other character."""
    out = []
    for ch in text:
        if ch in WHITESPACE_SYMBOLS:
            out.append(WHITESPACE_SYMBOLS[ch])
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"):
            out.append(f"⟨U+{ord(ch):04X}⟩")
        else:
            out.append(ch)
    return "".join(out)


def label_text(text: str) -> str:
    """How a token's text is labelled: one word-initial space kept as a plain space, every other
    whitespace or invisible character made visible (`show`); a whitespace-only token is all
    symbols ("␣", "␣␣", "↵")."""
    if text[:1] == WORD_SPACE and text[1:] and not text[1:].isspace():
        return WORD_SPACE + show(text[1:])
    return show(text)


def plain(label: str) -> str:
    """The text a complete label stands for: whitespace symbols back to the characters."""
    for ch, symbol in WHITESPACE_SYMBOLS.items():
        label = label.replace(symbol, ch)
    return label


def piece_bytes(piece: str, kind: str) -> bytes:
    if kind == "bytelevel":
        table = _byte_decoder()
        if all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        return piece.encode("utf-8")
    if kind == "sentencepiece":
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])  # byte-fallback piece
        return piece.replace("▁", " ").encode("utf-8")
    return piece.encode("utf-8")


PARTIAL = "…"  # after a character whose bytes this token only starts or continues
DOTTED_CIRCLE = "◌"  # the base a lone combining mark (e.g. an emoji's U+FE0F) is shown on


def labels(tokenizer, ids: list[int]) -> tuple[list[str], list[bool]]:
    """(labels, is_special) for token ids. A byte-level (or byte-fallback) tokenizer's pieces are
    decoded back into the characters they spell: the token that completes a character shows it,
    every earlier piece of it shows it followed by PARTIAL ("苹…", "苹…", "苹"), after whatever
    complete characters that piece also holds (" 😀…" for a space plus the emoji's first bytes).
    Spaces and whitespace are shown as `label_text` says: " love", never "▁love" or "Ġlove"."""
    special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    special = [i in special_ids for i in ids]
    pieces = tokenizer.convert_ids_to_tokens(list(ids))
    return piece_labels(pieces, special, tokenizer_kind(tokenizer), ids)


def _shown(text: str, own: str | None = None) -> str:
    """The label of a token spelling ``text``, of which ``own`` (default: all) it completes."""
    shown = label_text(text)
    own = text if own is None else own
    if unicodedata.category(own[:1] or "a") in ("Mn", "Me"):  # it would draw on nothing
        shown = DOTTED_CIRCLE + shown
    return shown


def piece_labels(pieces: list, special: list[bool], kind: str, ids=None) -> tuple[list[str], list[bool]]:
    """`labels` of a tokenizer's raw pieces (``kind`` from `tokenizer_kind`); a None piece is
    labelled by its id."""
    ids = list(ids) if ids is not None else list(range(len(pieces)))
    out: list[str] = [""] * len(pieces)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending: list[tuple[int, str]] = []  # (token, its complete text) of a character not yet complete

    def finish(char: str):
        for p, before in pending:
            out[p] = _shown(before + char, before) + PARTIAL
        pending.clear()

    for n, (tid, piece) in enumerate(zip(ids, pieces)):
        piece = piece if piece is not None else f"<{tid}>"
        if special[n]:
            if pending:  # a dangling partial character before a special token
                finish(decoder.decode(b"", final=True) or "�")
                decoder.reset()
            out[n] = piece
            continue
        if kind == "wordpiece":
            out[n] = show(piece)
            continue
        text = decoder.decode(piece_bytes(piece, kind))
        if text and pending:
            finish(text[0])
        if decoder.getstate()[0]:  # this token also starts a character a later token completes
            pending.append((n, text))
        else:
            out[n] = _shown(text)
    if pending:
        finish(decoder.decode(b"", final=True) or "�")
    return out, list(special)


def completed(label: str) -> str:
    """The characters a token label says its token completes: the label without the character
    it only starts or continues (" 😀…" -> " ", "苹…" -> "", "苹" -> "苹")."""
    label = label.removeprefix(DOTTED_CIRCLE)
    if not label.endswith(PARTIAL):
        return label
    body = label[:-len(PARTIAL)]
    if body.endswith("⟩") and "⟨U+" in body:   # an invisible character, as `show` writes it
        return body[:body.rindex("⟨U+")]
    return body[:-1]


def spelled_ends(token_labels: list[str], word: str) -> list[int]:
    """The tokens that complete an occurrence of ``word`` in the text the labels spell (leading
    space marks ignored), e.g. 苹果 over "苹…", "苹…", "苹", "果" ends at the "果" token."""
    return [last for _, last in spelled_spans(token_labels, word)]


def spelled_spans(token_labels: list[str], word: str) -> list[tuple[int, int]]:
    """(first, last) token of each occurrence of ``word`` in the text the labels spell: from the
    first token holding any of its bytes to the token completing it, e.g. 苹果 over "苹…", "苹…",
    "苹", "果" is (0, 3); 它 inside the one token 把它 is that token alone."""
    word = word.replace(" ", "")
    if not word:
        return []
    texts = [completed(label) for label in token_labels]
    for mark in LEADING_SPACE_MARKS:
        texts = [text.replace(mark, "") for text in texts]
    owner = [n for n, text in enumerate(texts) for _ in text]
    joined = "".join(texts)
    spans, at = [], joined.find(word)
    while at >= 0:
        first = owner[at]
        # earlier tokens holding only the first bytes of the word's first character belong to it
        while first > 0 and token_labels[first - 1].endswith(PARTIAL) \
                and token_labels[first - 1][len(completed(token_labels[first - 1])):-len(PARTIAL)] == word[0]:
            first -= 1
        spans.append((first, owner[at + len(word) - 1]))
        at = joined.find(word, at + 1)
    return spans


def several_characters(token_labels: list[str], special=None) -> list[tuple[int, str, int]]:
    """(position, characters, count) of each token that holds two or more Chinese, Japanese or
    Korean characters (了一个 is one token holding 3): a reader of those scripts expects one
    character a token, so the page says where a token holds more."""
    out = []
    for n, label in enumerate(token_labels):
        if special is not None and special[n]:
            continue
        text = completed(label)
        count = sum(1 for ch in text if re.match(f"[{_CJK}]", ch))
        if count >= 2:
            out.append((n, text.lstrip("".join(LEADING_SPACE_MARKS)), count))
    return out


# --- Is the text inside the model's vocabulary? ---------------------------------------------------
# A word counts as "spelled out" when the tokenizer needs two or more pieces averaging under this
# many characters each: MiniLM writes "привет" as п ##р ##и ##в ##е ##т (1.0), SmolLM2 as byte
# pieces (1.2); English words, even rare ones, average 2.5 and more ("x ##yl ##ophone ##s").
FRAGMENT_MAX_CHARS_PER_TOKEN = 1.5
# Warn when at least this share of the text's letters is spelled out or [UNK]: "mostly outside".
OUTSIDE_WARN_SHARE = 0.5
COVERAGE_MAX_CHARS = 20_000   # only the start of a long text is checked (tokenizing is cheap, not free)

# Letters only (digits are split one by one on purpose by some tokenizers); each CJK ideograph,
# kana or Hangul syllable is a word of its own, as BERT's pre-tokenizer treats it, so a model
# that has them as whole tokens is not flagged, but one that needs byte pieces for them is.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_WORDS = re.compile(f"[{_CJK}]|[^\\W\\d_{_CJK}]+")


@dataclass(frozen=True)
class Coverage:
    """How much of a text the tokenizer covers with real vocabulary (see `vocabulary_coverage`)."""
    letters: int                 # characters looked at: letters of words, plus text under [UNK]
    outside: int                 # of those, in [UNK] tokens or in words spelled out piece by piece
    words: int
    spelled_out: int             # words split into pieces of < FRAGMENT_MAX_CHARS_PER_TOKEN chars
    unknown: int                 # [UNK] tokens
    examples: tuple[str, ...]    # a few such words or [UNK] spans, as written in the text

    @property
    def share(self) -> float:
        return self.outside / self.letters if self.letters else 0.0

    @property
    def mostly_outside(self) -> bool:
        return self.letters > 0 and self.share >= OUTSIDE_WARN_SHARE


def vocabulary_coverage(tokenizer, text: str, max_chars: int = COVERAGE_MAX_CHARS) -> Coverage | None:
    """Measure how much of ``text`` (its first ``max_chars`` characters) falls outside the
    tokenizer's vocabulary: the share of its letters that end up in [UNK] tokens or in words the
    tokenizer spells out in pieces of under FRAGMENT_MAX_CHARS_PER_TOKEN characters each.
    None when the tokenizer cannot map tokens back to characters (no offsets)."""
    text = text[:max_chars]
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                            verbose=False)
    except (NotImplementedError, ValueError, TypeError):
        return None
    unk_id = getattr(tokenizer, "unk_token_id", None)
    # Byte-level tokenizers have no unknown token; some name <|endoftext|> as one anyway.
    if unk_id in {getattr(tokenizer, f"{name}_token_id", None) for name in ("eos", "bos", "pad")}:
        unk_id = None
    spans = [(int(a), int(b), unk_id is not None and int(tid) == unk_id)
             for tid, (a, b) in zip(encoded["input_ids"], encoded["offset_mapping"]) if b > a]
    spans.sort()
    starts = [a for a, _, _ in spans]
    counted = bytearray(len(text))
    outside = bytearray(len(text))
    examples: list[str] = []
    words = spelled_out = 0
    for match in _WORDS.finditer(text):
        s, e = match.span()
        words += 1
        counted[s:e] = b"\x01" * (e - s)
        # Tokens overlapping the word: spans are sorted by start, and no token is very long.
        i = max(0, bisect.bisect_left(starts, s) - 1)
        pieces = 0
        while i < len(spans) and spans[i][0] < e:
            if spans[i][1] > s:
                pieces += 1
            i += 1
        if pieces >= 2 and (e - s) / pieces < FRAGMENT_MAX_CHARS_PER_TOKEN:
            spelled_out += 1
            outside[s:e] = b"\x01" * (e - s)
            if len(examples) < 3:
                examples.append(match.group())
    unknown = 0
    for s, e, is_unk in spans:
        if is_unk:
            unknown += 1
            counted[s:e] = outside[s:e] = b"\x01" * (e - s)
            if len(examples) < 3 and text[s:e] not in examples:
                examples.append(text[s:e])
    return Coverage(letters=sum(counted), outside=sum(outside), words=words,
                    spelled_out=spelled_out, unknown=unknown, examples=tuple(examples))


# Unicode names a script's letters by a first word that is not the script's usual name.
_SCRIPT_OF_NAME = {"CJK": "Han", "HIRAGANA": "Kana", "KATAKANA": "Kana", "HANGUL": "Hangul",
                   "FULLWIDTH": "Latin"}
SCRIPT_WORDS = {"Han": "Chinese characters", "Kana": "Japanese kana", "Hangul": "Korean Hangul"}


def main_script(text: str, max_chars: int = COVERAGE_MAX_CHARS) -> str | None:
    """The script most of the text's letters are written in ("Latin", "Han", "Cyrillic", ...),
    from the first word of each letter's Unicode name; None when the text has no letters."""
    counts: Counter[str] = Counter()
    for ch in text[:max_chars]:
        if ch.isalpha() and (first := unicodedata.name(ch, "").split(" ")[0]):
            counts[_SCRIPT_OF_NAME.get(first, first.title())] += 1
    return counts.most_common(1)[0][0] if counts else None


def vocabulary_warning(tokenizer, text: str, model_name: str = "this model") -> str | None:
    """A sentence for the page when most of ``text`` is outside the vocabulary, else None."""
    coverage = vocabulary_coverage(tokenizer, text)
    if coverage is None or not coverage.mostly_outside:
        return None
    shown = ", ".join(f"“{show(e)}”" for e in coverage.examples)
    # A byte-level tokenizer has no [UNK]: what it cannot spell with its vocabulary it splits into
    # the UTF-8 bytes of each character.
    bytelevel = tokenizer_kind(tokenizer) == "bytelevel"
    how = ("are split into the bytes of each character or into pieces" if bytelevel
           else "become [UNK] tokens or words spelled out in pieces")
    # Bytes lose nothing (its heads can still link the words: SmolLM2's 它 → 苹果); [UNK] does.
    then = ("Each character is labelled on the token that completes it (its earlier pieces end "
            f"in “{PARTIAL}”); the model sees every byte, so its heads can still link words, but a "
            "model trained on this language would read them as whole tokens." if bytelevel else
            "Its attention patterns say little about how the model reads words; a model trained "
            "on this language would.")
    return (f"Most of this text is outside {model_name}'s vocabulary: {coverage.share:.0%} of its "
            f"letters {how} of under {FRAGMENT_MAX_CHARS_PER_TOKEN:g} characters (e.g. {shown}). "
            + then)
