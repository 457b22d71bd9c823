"""Readable token labels: byte-level BPE pieces shown as text, CJK and emoji intact, no mojibake.

A byte-level tokenizer (GPT-2, SmolLM2) may split one character's UTF-8 bytes over several
tokens. Each label holds the characters its token completes; a token that only starts a character
is labelled with that character and a trailing '…', so no label is ever a broken byte sequence.
"""
from __future__ import annotations

import codecs
import unicodedata
from functools import lru_cache

SPACE = "▁"  # leading-space marker (as SentencePiece shows it)
VISIBLE = {"\n": "↵", "\r": "⏎", "\t": "⇥", " ": SPACE}


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
        if ch in VISIBLE:
            out.append(VISIBLE[ch])
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"):
            out.append(f"⟨U+{ord(ch):04X}⟩")
        else:
            out.append(ch)
    return "".join(out)


def _piece_bytes(piece: str, kind: str) -> bytes:
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


def labels(tokenizer, ids: list[int]) -> tuple[list[str], list[bool]]:
    """(labels, is_special) for token ids."""
    special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    pieces = tokenizer.convert_ids_to_tokens(list(ids))
    kind = tokenizer_kind(tokenizer)
    out: list[str] = [""] * len(ids)
    special = [i in special_ids for i in ids]
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending: list[int] = []  # tokens whose bytes started a character not yet complete
    for n, (tid, piece) in enumerate(zip(ids, pieces)):
        piece = piece if piece is not None else f"<{tid}>"
        if special[n]:
            if pending:  # a dangling partial character before a special token
                text = decoder.decode(b"", final=True)
                for p in pending:
                    out[p] = show(text) or "�"
                pending = []
                decoder.reset()
            out[n] = piece
            continue
        if kind == "wordpiece":
            out[n] = show(piece)
            continue
        text = decoder.decode(_piece_bytes(piece, kind))
        if not text:
            pending.append(n)
            continue
        for p in pending:
            out[p] = show(text[0]) + "…"
        pending = []
        out[n] = show(text)
    if pending:
        text = decoder.decode(b"", final=True)
        for p in pending:
            out[p] = show(text) or "�"
    return out, special
