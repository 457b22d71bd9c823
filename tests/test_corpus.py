"""Corpora: the bundled ones, uploads (.txt / .csv / .jsonl / audio / images), bounds and their notes,
and clear refusals of malformed files."""
import io
import json
import pickle

import numpy as np
import pytest
from PIL import Image

from attnviz.analysis import corpus
from attnviz.analysis.corpus import CorpusLimits, open_corpus


def test_every_bundled_corpus_opens_with_real_items_and_a_licence():
    for key, description in corpus.bundled_corpora().items():
        c = open_corpus(key)
        assert description and c.key == key and c.source and c.licence and not c.notes
        assert len(c) >= 5 and c.labels is None
        if c.kind == "text":
            assert all(isinstance(t, str) and t.strip() for t in c.items)
        elif c.kind == "audio":
            assert all(a.dtype == np.float32 and a.ndim == 1 and 2 * 16_000 < len(a) < 8 * 16_000 for a in c.items)
        else:
            assert all(i.dtype == np.uint8 and i.ndim == 3 and i.shape[2] == 3 for i in c.items)
        pickle.loads(pickle.dumps(c))   # items travel to workers


def test_bundled_texts_are_the_shipped_real_sentences():
    en, pt = open_corpus("gtk-en").items, open_corpus("gtk-pt").items
    assert len(en) == len(pt) == 145
    assert en[3] == "Copy one or more files from SOURCE to DESTINATION."
    assert pt[3] == "Copia um ou mais arquivos de ORIGEM para DESTINO."
    en, zh = open_corpus("django-en").items, open_corpus("django-zh").items
    assert len(en) == len(zh) == 50 and zh[2] == "只能输入用逗号分隔的数字。"
    assert en[2] == "Enter only digits separated by commas."
    paragraphs = open_corpus("alice-paragraphs").items
    assert paragraphs[0].startswith("Alice was beginning to get very tired of sitting by her sister")
    sentences = open_corpus("alice-sentences").items
    assert all(6 <= len(s.split()) <= 40 for s in sentences) and len(sentences) > 50


def test_default_corpus_per_model_kind():
    assert corpus.default_corpus("lm") == "alice-paragraphs"
    assert corpus.default_corpus("encoder") == "alice-sentences"
    assert corpus.default_corpus("translator", "en-pt") == "gtk-en"
    assert corpus.default_corpus("translator", "pt-en") == "gtk-pt"
    assert corpus.default_corpus("speech") == "librivox-austen"
    assert corpus.default_corpus("vision") == "skimage-photos"
    with pytest.raises(ValueError, match="unknown model kind"):
        corpus.default_corpus("robot")


def test_txt_is_a_line_a_text_and_blank_lines_are_skipped():
    c = open_corpus("mine.txt", data="first line\n\n  second line  \r\nthird\n".encode())
    assert c.items == ["first line", "second line", "third"] and c.kind == "text" and c.key == "mine.txt"
    assert c.labels is None and c.notes == []


def test_rows_characters_and_bytes_are_bounded_with_a_note_each():
    data = "\n".join(f"row {i} " + "x" * 50 for i in range(30)).encode()
    c = open_corpus("a.txt", data=data, limits=CorpusLimits(max_rows=10, max_chars_per_row=20))
    assert len(c) == 10 and all(len(t) == 20 for t in c.items)
    assert any("first 10 of 30 rows" in n for n in c.notes) and any("cut to 20 characters" in n for n in c.notes)
    c = open_corpus("a.txt", data=data, limits=CorpusLimits(max_bytes=200))
    assert any("first" in n and "bytes" in n for n in c.notes)
    assert all(t.startswith("row ") and len(t) == len("row 0 ") + 50 for t in c.items)  # whole lines only
    assert len(c) == 3


def test_a_byte_cut_inside_a_character_is_not_an_encoding_error():
    data = ("é" * 100).encode()   # 200 bytes, no newline: the cut falls inside a character
    c = open_corpus("a.txt", data=data, limits=CorpusLimits(max_bytes=51))
    assert c.items == ["é" * 25] and c.notes


def test_csv_column_and_labels():
    data = b"id,sentence,score\n1,A cat sits.,0.5\n2,\"Quoted, with comma\",1.5\n3,,2\n"
    c = open_corpus("s.csv", data=data, column="sentence", label_column="score")
    assert c.items == ["A cat sits.", "Quoted, with comma"] and c.labels == [0.5, 1.5]
    assert any("skipped 1 empty row" in n for n in c.notes)
    c = open_corpus("s.csv", data=b"text,other\nhello,x\n")
    assert c.items == ["hello"]
    pair = open_corpus("p.csv", data=b"a,b,sim\nx y,z w,3\n", column="a+b", label_column="sim")
    assert pair.items == ["x y\tz w"] and pair.labels == [3.0]


@pytest.mark.parametrize("data, column, label, message", [
    (b"text\nok\n", "missing", None, "has no column 'missing'"),
    (b"text,score\nok,high\n", "text", "score", "not a number"),
    (b"text,score\nok,nan\n", "text", "score", "not a finite number"),
    (b"a,b\n1,2,3\n", "a", None, "3 fields where the header has 2"),
    (b"a,a\n1,2\n", None, None, "names a column twice"),
    (b"text\n\xff\xfe\x00bad\n", None, None, "not UTF-8"),
    (b"", None, None, "no header row"),
])
def test_malformed_csv_is_refused_clearly(data, column, label, message):
    with pytest.raises(ValueError, match=message):
        open_corpus("bad.csv", data=data, column=column, label_column=label)


def test_jsonl_objects_or_strings_with_labels():
    lines = [json.dumps({"text": "one", "y": 1}), "", json.dumps({"text": "two", "y": 2.5})]
    c = open_corpus("d.jsonl", data="\n".join(lines).encode(), label_column="y")
    assert c.items == ["one", "two"] and c.labels == [1.0, 2.5]
    assert open_corpus("s.jsonl", data=b'"just a string"\n').items == ["just a string"]


@pytest.mark.parametrize("data, message", [
    (b'{"text": "ok"}\n{"text": oops}\n', "line 2: not JSON"),
    (b'[1, 2]\n', "line 1: each line must be a JSON object"),
    (b'{"other": "x"}\n', "has no column 'text'"),
    (b'{"text": "a"}\n{"nope": 1}\n', "line 2: the field 'text' is missing"),
    (b'\n\n', "no JSON lines"),
])
def test_malformed_jsonl_is_refused_clearly(data, message):
    with pytest.raises(ValueError, match=message):
        open_corpus("bad.jsonl", data=data, column="text" if b"nope" in data or b"other" in data else None)


def test_unknown_things_are_refused():
    with pytest.raises(ValueError, match="neither a bundled corpus"):
        open_corpus("no-such-corpus")
    with pytest.raises(ValueError, match="give a .txt"):
        open_corpus("x.docx", data=b"PK")
    with pytest.raises(ValueError, match="no columns"):
        open_corpus("x.txt", data=b"a\n", column="text")
    with pytest.raises(ValueError, match="holds no text"):
        open_corpus("x.txt", data=b"\n \n")


def _png(colour, size=(20, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def _wav(seconds=0.5, rate=8000) -> bytes:
    import soundfile
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    soundfile.write(buf, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


def test_several_image_or_audio_files_and_a_folder(tmp_path):
    c = open_corpus([("a.png", _png("red")), ("b.png", _png("blue", (900, 300)))])
    first, second = (corpus.ready_item(i) for i in c.items)
    assert c.kind == "image" and first.shape == (10, 20, 3) and tuple(first[0, 0]) == (255, 0, 0)
    assert max(second.shape[:2]) == corpus.MAX_IMAGE_SIDE
    c = open_corpus([("a.wav", _wav())])
    clip = corpus.ready_item(c.items[0])
    assert c.kind == "audio" and clip.dtype == np.float32 and len(clip) == 8000   # 16 kHz
    (tmp_path / "x.wav").write_bytes(_wav())
    (tmp_path / "y.wav").write_bytes(_wav(1.0))
    c = open_corpus(tmp_path)
    assert [len(corpus.ready_item(a)) for a in c.items] == [8000, 16000] and c.key == tmp_path.name
    c = open_corpus(tmp_path, limits=CorpusLimits(max_rows=1))
    assert len(c) == 1 and "first 1 of 2 files" in c.notes[0]
    c = open_corpus(tmp_path, limits=CorpusLimits(max_bytes=len(_wav()) + 10))
    assert len(c) == 1 and "would pass" in c.notes[0]


def test_bad_media_is_refused_with_the_file_named(tmp_path):
    with pytest.raises(ValueError, match="mixes audio and images"):
        open_corpus([("a.png", _png("red")), ("b.wav", _wav())])
    with pytest.raises(ValueError, match="broken.png"):
        open_corpus([("ok.png", _png("red")), ("broken.png", b"\x89PNG\r\n\x1a\nnot really")])
    with pytest.raises(ValueError, match="notes.txt is neither audio"):
        open_corpus([("a.png", _png("red")), ("notes.txt", b"hi")])
    with pytest.raises(ValueError, match="silent"):
        open_corpus([("quiet.wav", _silent())])


def _silent() -> bytes:
    import soundfile
    buf = io.BytesIO()
    soundfile.write(buf, np.zeros(8000, np.float32), 16000, format="WAV")
    return buf.getvalue()


def test_jsonl_nested_deep_is_a_message_not_a_recursion_error():
    line = b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    with pytest.raises(ValueError, match="line 1: its JSON is nested too deeply"):
        open_corpus("deep.jsonl", data=line)


def test_a_label_of_hundreds_of_digits_is_a_message_not_an_overflow():
    data = json.dumps({"text": "a text", "score": int("9" * 400)}).encode() + b"\n"
    with pytest.raises(ValueError, match="line 1: the label .* is not a number"):
        open_corpus("labels.jsonl", data=data, label_column="score")
    huge = b'{"text": "a text", "score": ' + b"9" * 5000 + b"}\n"
    with pytest.raises(ValueError, match="line 1: not JSON a row can hold"):
        open_corpus("labels.jsonl", data=huge, label_column="score")


def test_a_lone_surrogate_escape_is_refused_with_its_line():
    data = b'{"text": "fine"}\n{"text": "bad \\ud800 text"}\n'
    with pytest.raises(ValueError, match=r"line 2: it holds an unpaired surrogate"):
        open_corpus("s.jsonl", data=data)
    with pytest.raises(ValueError, match=r"line 1: it holds an unpaired surrogate"):
        open_corpus("s.jsonl", data=b'"\\udfff"\n')
    paired = open_corpus("s.jsonl", data=b'{"text": "emoji \\ud83d\\ude00"}\n')
    assert paired.items == ["emoji \U0001F600"]


def test_uploads_are_bounded_by_what_they_decode_to_and_held_as_their_bytes(monkeypatch):
    from attnviz.base import memory
    png = _png("red", (448, 448))
    files = [(f"p{i}.png", png) for i in range(2000)]                      # a few MB, 1.2 GB decoded
    c = open_corpus(files, limits=CorpusLimits(max_decoded_bytes=30 * 448 * 448 * 3))
    assert len(c) == 30 and "would decode past" in c.notes[-1]
    held = sum(len(i.data) for i in c.items)
    assert all(isinstance(i, corpus.MediaItem) for i in c.items) and held == 30 * len(png)
    assert held < 448 * 448 * 3                                             # less than one decoded photo
    assert pickle.loads(pickle.dumps(c)).items[0] == c.items[0]             # travels to workers as bytes
    asked = []
    monkeypatch.setattr(memory, "check_room", lambda what, need=0: asked.append((what, need)))
    assert corpus.ready_item(c.items[0]).shape == (448, 448, 3)
    assert asked == [("decoding p0.png", 448 * 448 * 4)]                    # the guard, before the decode

    def full(what, need=0):
        raise ValueError(f"the server is short of memory: try {what} again later")
    monkeypatch.setattr(memory, "check_room", full)
    with pytest.raises(ValueError, match="short of memory: try decoding p0.png"):
        open_corpus(files[:1])
