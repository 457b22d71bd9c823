"""Corpora for corpus runs: bundled real text, speech and photos, and bounded user uploads.

A `Corpus` is a plain, picklable list of items (str for text, float32 samples at 16 kHz for
audio, uint8 H x W x 3 for images; an uploaded file is a `corpus_media.MediaItem`, its bytes,
decoded by `ready_item` when a run reaches it), optional float labels, and notes saying what was cut and why.
The bundled corpora are real published text, recordings and photos (sources and licences in
attnviz/data/corpora/README.md); uploads are `.txt` (a line a text), `.csv` / `.jsonl` (a column,
optionally a label column) and WAV / FLAC / image files, decoded through attnviz.uploads (never
unpickled). Every bound is in `CorpusLimits`; tokens per row are cut by the run
(corpus_metrics.output), the rest here.
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

import numpy as np

from attnviz.analysis.corpus_media import (  # noqa: F401  (the media names, importable from here)
    AUDIO_SUFFIXES, IMAGE_SUFFIXES, MAX_AUDIO_SECONDS, MAX_IMAGE_SIDE, MediaItem, image_array, media_items,
    ready_item)
from attnviz.base.texts import eval_text
from attnviz.uploads.audio import read_audio
from attnviz.uploads.images import sample_images

DATA = files("attnviz") / "data" / "corpora"
TEXT_SUFFIXES = (".txt", ".csv", ".jsonl")
PAIR = "\t"                # an encoder item "a<TAB>b" is a sentence pair (label: their similarity)


@dataclass(frozen=True)
class CorpusLimits:
    max_rows: int = 2000
    max_bytes: int = 5_000_000
    max_chars_per_row: int = 2000
    max_tokens_per_row: int = 128
    max_decoded_bytes: int = 256_000_000   # uploaded audio / images: samples and pixels once decoded


@dataclass
class Corpus:
    key: str                       # bundled key, or the uploaded file's name
    kind: str                      # "text" | "audio" | "image"
    items: list
    labels: list[float] | None = None
    notes: list[str] = field(default_factory=list)
    source: str = ""
    licence: str = ""

    def __len__(self) -> int:
        return len(self.items)


# ---------------------------------------------------------------- bundled corpora
def _alice_paragraphs() -> list[str]:
    paras = [p.replace("\n", " ").strip() for p in eval_text().split("\n\n")]
    return [p for p in paras if len(p.split()) >= 8 and not p.startswith("CHAPTER")]


SENTENCE_END = re.compile(r"(?<=[.!?])'?\s+(?=['A-Z])")


def _alice_sentences() -> list[str]:
    out = []
    for para in _alice_paragraphs():
        out += [s.strip() for s in SENTENCE_END.split(para) if 6 <= len(s.split()) <= 40]
    return out


def _messages(column: str, name: str = "gtk_messages_en_pt.csv") -> list[str]:
    text = (DATA / name).read_text(encoding="utf-8")
    return [row[column] for row in csv.DictReader(io.StringIO(text))]


def _librivox() -> list[np.ndarray]:
    folder = DATA / "librivox"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".wav"))
    return [read_audio((folder / n).read_bytes()).samples for n in names]


def _photos() -> list[np.ndarray]:
    return [image_array(path.read_bytes()) for path in sample_images().values()]


ALICE = ("Lewis Carroll, Alice's Adventures in Wonderland, chapters I-II (attnviz/data/eval_en.txt, "
         "from the Canterbury corpus in the brotli sdist)", "public domain")
GTK = ("English messages of GLib and GTK 3 with their Brazilian Portuguese translations (Debian "
       "libglib2.0-data, libgtk-3-common)", "LGPL-2.1-or-later (GLib, GTK and their translators)")
DJANGO = ("Django 5.2.8's English messages with their Simplified Chinese translations (the django wheel's "
          "zh_Hans catalogues)", "BSD-3-Clause (Django Software Foundation and individual contributors)")
BUNDLED = {
    "alice-paragraphs": ("text", "Alice in Wonderland, chapters I-II: one paragraph a text (English prose)",
                         _alice_paragraphs, *ALICE),
    "alice-sentences": ("text", "Alice in Wonderland, chapters I-II: one sentence a text (English prose)",
                        _alice_sentences, *ALICE),
    "gtk-en": ("text", "145 English messages of GLib / GTK 3 (the source side of gtk-pt)",
               lambda: _messages("en"), *GTK),
    "gtk-pt": ("text", "the same 145 messages in Brazilian Portuguese, as GTK's translators wrote them",
               lambda: _messages("pt"), *GTK),
    "django-zh": ("text", "50 messages of Django in Simplified Chinese, as its translators wrote them",
                  lambda: _messages("zh", "django_messages_en_zh.csv"), *DJANGO),
    "django-en": ("text", "the same 50 Django messages in English (the source side of django-zh)",
                  lambda: _messages("en", "django_messages_en_zh.csv"), *DJANGO),
    "librivox-austen": ("audio", "5 LibriVox clips of Sense and Sensibility, read aloud (3-7 s, English)",
                        _librivox, "LibriVox recording (pocketsphinx test data, Debian pocketsphinx-testdata)",
                        "public domain (LibriVox); package BSD-2-Clause"),
    "skimage-photos": ("image", "5 photos from scikit-image: cat, coffee, astronaut, rocket, motorcycle",
                       _photos, "scikit-image's skimage/data", "BSD-3-Clause (scikit-image)"),
}
DEFAULTS = {"lm": "alice-paragraphs", "encoder": "alice-sentences", "translator": "gtk-en",
            "speech": "librivox-austen", "vision": "skimage-photos"}
SOURCE_LANGUAGE = {"pt-en": "gtk-pt"}   # translators whose source is not English


def bundled_corpora() -> dict[str, str]:
    """Bundled key -> one-line description."""
    return {key: spec[1] for key, spec in BUNDLED.items()}


def default_corpus(model_kind: str, model_key: str | None = None) -> str:
    """The bundled corpus a model kind ("lm" | "encoder" | "translator" | "speech" | "vision") is
    run on by default; `model_key` picks the source language of a translator."""
    if model_kind not in DEFAULTS:
        raise ValueError(f"unknown model kind {model_kind!r}; choose one of {sorted(DEFAULTS)}")
    if model_kind == "translator" and model_key in SOURCE_LANGUAGE:
        return SOURCE_LANGUAGE[model_key]
    return DEFAULTS[model_kind]


def corpus_kind(model_kind: str) -> str:
    """The kind of items a model kind reads."""
    return {"speech": "audio", "vision": "image"}.get(model_kind, "text")


# ---------------------------------------------------------------- opening
def open_corpus(source, *, data: bytes | None = None, column: str | None = None,
                label_column: str | None = None, limits: CorpusLimits = CorpusLimits()) -> Corpus:
    """A corpus from a bundled key, a file (name + `data`, or a path), a folder of audio or image
    files, or several uploaded files (a list of (name, bytes)). Text is cut to `limits` (rows,
    bytes, characters per row) with a note for each cut; ValueError says what is wrong with a
    malformed file. `column` / `label_column` choose a CSV / JSONL field (`column="a+b"` joins two
    fields into a sentence pair for an encoder)."""
    if isinstance(source, (list, tuple)):
        return _media(list(source), "uploaded files", limits)
    if isinstance(source, str) and data is None and source in BUNDLED:
        return _bundled(source, limits)
    path = Path(str(source))
    if data is None:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
            return _media([(p.name, p) for p in found], path.name, limits)
        if not path.is_file():
            raise ValueError(f"{source!r} is neither a bundled corpus ({', '.join(BUNDLED)}) nor a file or folder")
        if path.stat().st_size > limits.max_bytes and path.suffix.lower() not in TEXT_SUFFIXES:
            raise ValueError(f"{path.name} is {path.stat().st_size:,} bytes; the limit is {limits.max_bytes:,}")
        data = path.read_bytes()[:limits.max_bytes + 1]
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return _text_file(path.name, bytes(data), suffix, column, label_column, limits)
    if suffix in AUDIO_SUFFIXES + IMAGE_SUFFIXES:
        return _media([(path.name, bytes(data))], path.name, limits)
    raise ValueError(f"{path.name}: give a .txt (a line a text), .csv or .jsonl (a column), "
                     f"audio ({', '.join(AUDIO_SUFFIXES)}) or images ({', '.join(IMAGE_SUFFIXES)})")


def _bundled(key: str, limits: CorpusLimits) -> Corpus:
    kind, _, load, source, licence = BUNDLED[key]
    items, notes = load(), []
    if kind == "text":
        items, notes, _ = _bound_rows(items, limits)
    elif len(items) > limits.max_rows:
        notes.append(f"kept the first {limits.max_rows:,} of {len(items):,} items (the row limit)")
        items = items[:limits.max_rows]
    return Corpus(key, kind, items, None, notes, source, licence)


def _bound_rows(rows: list[str], limits: CorpusLimits, labels=None):
    """(rows, notes, labels) cut to the row and character limits, with a note per kind of cut."""
    notes = []
    if len(rows) > limits.max_rows:
        notes.append(f"kept the first {limits.max_rows:,} of {len(rows):,} rows (the row limit)")
        rows = rows[:limits.max_rows]
        labels = None if labels is None else labels[:limits.max_rows]
    long = sum(len(r) > limits.max_chars_per_row for r in rows)
    if long:
        notes.append(f"{long:,} row{'s' * (long > 1)} cut to {limits.max_chars_per_row:,} characters")
        rows = [r[:limits.max_chars_per_row] for r in rows]
    return rows, notes, labels


def _decoded(name: str, data: bytes, limits: CorpusLimits) -> tuple[str, list[str]]:
    notes = []
    if len(data) > limits.max_bytes:
        cut = data.rfind(b"\n", 0, limits.max_bytes + 1)
        data = data[:cut if cut > 0 else limits.max_bytes]
        notes.append(f"read the first {len(data):,} bytes of {name} (the limit is {limits.max_bytes:,} bytes)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        if notes and err.start >= len(data) - 4:   # the byte cut split a character
            text = data[:err.start].decode("utf-8-sig")
        else:
            raise ValueError(f"{name} is not UTF-8 text (byte {err.start:,}): save it as UTF-8") from None
    if "\x00" in text:
        raise ValueError(f"{name} holds NUL characters: it is not a text file")
    return text, notes


def _text_file(name, data, suffix, column, label_column, limits) -> Corpus:
    text, notes = _decoded(name, data, limits)
    if suffix == ".txt":
        if column or label_column:
            raise ValueError("a .txt corpus is one text a line: it has no columns (use .csv or .jsonl)")
        rows, labels = [line.strip() for line in text.splitlines() if line.strip()], None
    elif suffix == ".csv":
        rows, labels, more = _csv_rows(name, text, column, label_column)
        notes += more
    else:
        rows, labels, more = _jsonl_rows(name, text, column, label_column)
        notes += more
    if not rows:
        raise ValueError(f"{name} holds no text")
    rows, cut_notes, labels = _bound_rows(rows, limits, labels)
    return Corpus(name, "text", rows, labels, notes + cut_notes, f"uploaded file {name}", "the uploader's")


def _fields(name: str, header: list[str], column, label_column) -> tuple[list[str], str | None, list[str]]:
    notes = []
    if column is None:
        column = "text" if "text" in header else header[0]
        if len(header) > 1:
            notes.append(f"read the column {column!r} of {name}")
    wanted = column.split("+") if "+" in column else [column]
    for c in wanted + ([label_column] if label_column else []):
        if c not in header:
            raise ValueError(f"{name} has no column {c!r}; its columns are {', '.join(map(repr, header))}")
    if len(wanted) > 2:
        raise ValueError("join at most two columns into a pair (column='a+b')")
    return wanted, label_column, notes


def _row(name: str, where: str, record: dict, wanted: list[str], label_column) -> tuple[str, float | None]:
    parts = []
    for c in wanted:
        value = record.get(c)
        if value is None:
            raise ValueError(f"{name}, {where}: the field {c!r} is missing")
        value = str(value).replace(PAIR, " ").strip()
        parts.append(value)
    label = None
    if label_column:
        raw = record.get(label_column)
        try:
            label = float(raw)
        except (TypeError, ValueError, OverflowError):   # a JSON integer of hundreds of digits overflows
            raise ValueError(f"{name}, {where}: the label {raw!r} in {label_column!r} is not a number") from None
        if not math.isfinite(label):
            raise ValueError(f"{name}, {where}: the label {raw!r} is not a finite number")
    return PAIR.join(parts) if all(parts) else "", label


def _collect(name, records, wanted, label_column):
    rows, labels, empty = [], [], 0
    for where, record in records:
        text, label = _row(name, where, record, wanted, label_column)
        if not text:
            empty += 1
            continue
        rows.append(text)
        labels.append(label)
    notes = [f"skipped {empty:,} empty row{'s' * (empty > 1)}"] if empty else []
    return rows, (labels if label_column else None), notes


def _csv_rows(name, text, column, label_column):
    try:
        dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    reader = csv.reader(io.StringIO(text), dialect)
    try:
        table = list(reader)
    except csv.Error as err:
        raise ValueError(f"{name} is not a readable CSV (line {reader.line_num:,}): {err}") from None
    if not table or not any(table[0]):
        raise ValueError(f"{name} has no header row: its first line must name the columns")
    header = [h.strip() for h in table[0]]
    if len(set(header)) != len(header):
        raise ValueError(f"{name} names a column twice: {', '.join(header)}")
    wanted, label_column, notes = _fields(name, header, column, label_column)
    records = []
    for i, row in enumerate(table[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise ValueError(f"{name}, line {i:,}: {len(row)} fields where the header has {len(header)}")
        records.append((f"line {i:,}", dict(zip(header, row))))
    rows, labels, more = _collect(name, records, wanted, label_column)
    return rows, labels, notes + more


def _unpaired(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_characters(name: str, line: int, value) -> None:
    """A JSON escape such as \\ud800 makes a lone surrogate: no character, nothing a tokenizer or a
    file name can take. Refused with the line, like invalid UTF-8 in a file."""
    texts = [value] if isinstance(value, str) else \
        [t for kv in value.items() for t in kv if isinstance(t, str)] if isinstance(value, dict) else []
    if any(_unpaired(t) for t in texts):
        raise ValueError(f"{name}, line {line:,}: it holds an unpaired surrogate escape (such as \\ud800), "
                         "which is not a character; remove it or write the character itself")


def _jsonl_rows(name, text, column, label_column):
    records = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{name}, line {i:,}: not JSON ({err.msg})") from None
        except RecursionError:
            raise ValueError(f"{name}, line {i:,}: its JSON is nested too deeply to be a row") from None
        except ValueError as err:   # e.g. an integer of more digits than Python converts
            raise ValueError(f"{name}, line {i:,}: not JSON a row can hold ({str(err)[:80]})") from None
        _check_characters(name, i, value)
        if isinstance(value, str):
            value = {"text": value}
        if not isinstance(value, dict):
            raise ValueError(f"{name}, line {i:,}: each line must be a JSON object or string")
        records.append((f"line {i:,}", value))
    if not records:
        raise ValueError(f"{name} holds no JSON lines")
    header = list(dict.fromkeys(k for _, r in records for k in r))
    if not header:
        raise ValueError(f"{name}: its JSON objects have no fields")
    wanted, label_column, notes = _fields(name, header, column, label_column)
    rows, labels, more = _collect(name, records, wanted, label_column)
    return rows, labels, notes + more


# ---------------------------------------------------------------- audio and image files
def _media(files_in: list, label: str, limits: CorpusLimits) -> Corpus:
    """Audio clips or images, one file an item; all of one kind."""
    named = []
    for entry in files_in:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2):
            raise ValueError("give several files as (name, bytes) pairs")
        named.append((str(entry[0]), entry[1]))
    kinds = {"audio" if n.lower().endswith(AUDIO_SUFFIXES) else "image" if n.lower().endswith(IMAGE_SUFFIXES)
             else "other" for n, _ in named}
    if not named:
        raise ValueError(f"{label} holds no audio or image files")
    if "other" in kinds:
        bad = [n for n, _ in named if not n.lower().endswith(AUDIO_SUFFIXES + IMAGE_SUFFIXES)]
        raise ValueError(f"{bad[0]} is neither audio ({', '.join(AUDIO_SUFFIXES)}) nor an image: "
                         "a folder corpus holds one kind of file")
    if len(kinds) > 1:
        raise ValueError(f"{label} mixes audio and images: a corpus holds one kind")
    kind = kinds.pop()
    items, notes = media_items(named, kind, limits)
    if not items:
        raise ValueError(f"no file of {label} fits in {limits.max_bytes:,} bytes")
    return Corpus(label, kind, items, None, notes, f"uploaded {kind} files ({label})", "the uploader's")
