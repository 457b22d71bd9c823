"""Chinese as characters: byte-level pieces merged back into the characters they spell, the
founding notes' Chinese samples on the Attention page, and Find heads opening on 它 → 苹果."""
import re

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from attnviz.analysis import head_ranking
from attnviz.core.tokens import (PARTIAL, completed, labels, main_script, plain, several_characters, show, spelled_ends,
                                  vocabulary_warning)
from attnviz.ui import common
from attnviz.weights import catalogue
from tests.test_page_attention import PAGE, PICKER, _chart, _rank_table, _run, _view

APPLE = "我吃了一个苹果，它很甜"
VASE = "他打碎了花瓶，然后把它粘好了"
LOVE = "I love you. In Chinese: 我爱你"
ENGLISH = "The animal didn't cross the street because it was too tired."
# What a label must never hold: the tokenizers' space marks, byte-fallback pieces (<0xE4>), the
# raw bytes of a byte-level piece (ä, Ã, â€), a replacement character.
NOT_CHARACTERS = re.compile("[▁Ġ\ufffdÃÂâ¤¥¦§¨©ª«¬®¯°±²³´µ¶·¸¹º»¼½¾¿ĊĠ]|<0x[0-9A-Fa-f]{2}>")


def _unreadable(shown: list[str]) -> list[str]:
    return [t for t in shown if NOT_CHARACTERS.search(t)]



@pytest.mark.parametrize("text", [APPLE, VASE, "ok 😀 👨‍👩‍👧 ☀️！", "Ελληνικά हिन्दी ไทย 한국어"])
def test_every_character_is_spelled_by_the_tokens_that_complete_it(bytelevel, text):
    ids = bytelevel(text)["input_ids"]
    out, _ = labels(bytelevel, ids)
    assert len(out) == len(ids) > len(text)                     # split into bytes
    assert all("�" not in o and "Ã" not in o for o in out)      # no byte garbage
    assert plain("".join(completed(o) for o in out)) == plain(show(text))   # ZWJ shown as a symbol
    # every partial piece names the character it belongs to, which a later piece completes
    for n, o in enumerate(out):
        if o.endswith(PARTIAL):
            char = o[len(completed(o)):-len(PARTIAL)]
            assert char and any(char in completed(later) for later in out[n + 1:]), (o, out)


def test_a_piece_holding_a_space_and_the_start_of_an_emoji_says_both():
    """SmolLM2 writes " 😀" as " " + its first three bytes, then the last byte: the first piece
    was labelled as the space alone, so the emoji's start was lost."""
    tokenizer = common.shared_model("smollm2").tokenizer
    ids = tokenizer("我爱你 😀", add_special_tokens=False)["input_ids"]
    out, _ = labels(tokenizer, ids)
    assert out[-2:] == [" 😀" + PARTIAL, "😀"]
    assert out[:7] == ["我…", "我", "爱…", "爱…", "爱", "你…", "你"]


def test_a_lone_combining_mark_is_drawn_on_a_dotted_circle(bytelevel):
    out, _ = labels(bytelevel, bytelevel("☀\ufe0f")["input_ids"])
    assert out[-1] == "◌\ufe0f" and completed(out[-1]) == "\ufe0f"


def test_tokens_holding_several_cjk_characters_are_named():
    assert several_characters(["<bos>", "我", "了一个", "苹果", " 我们", "hello"], [1, 0, 0, 0, 0, 0]) == [
        (2, "了一个", 3), (3, "苹果", 2), (4, "我们", 2)]
    assert several_characters(["苹…", "苹", "果"]) == []            # byte pieces: one character each


def test_spelled_ends_finds_a_word_split_over_tokens():
    pieces = ["我…", "我", "吃…", "吃", "了", "一个", "苹…", "苹…", "苹", "果", "，", "它…", "它"]
    assert spelled_ends(pieces, "苹果") == [9]
    assert spelled_ends(pieces, "它") == [12]
    assert spelled_ends([" the", " animal", "s"], "animal") == [1]
    assert spelled_ends(pieces, "梨") == [] and spelled_ends(pieces, "") == []


@pytest.mark.parametrize("model_key", ["smollm2", "gemma3-270m", "e5-small", "minilm"])
def test_labels_show_characters_never_space_marks_or_bytes_on_every_bundled_text_model(model_key):
    """Labels read "▁love" (Gemma, e5-small); a word's space is now a plain leading space."""
    model = common.shared_model(model_key)
    for text in (ENGLISH, APPLE):
        tr = model.trace(text, attentions=False)
        assert not _unreadable(tr.tokens), tr.tokens
        words = [t for t, s in zip(tr.tokens, tr.special) if not s]
        if model_key == "minilm":                    # WordPiece: lower case, [UNK] for 苹果
            assert text == APPLE or ("animal" in words and "it" in words)
            continue
        spelled = "".join(completed(t) for t in words)
        assert spelled.lstrip(" ").replace(",", "，") == text       # e5-small: NFKC makes ， a ,
        if text == ENGLISH:
            assert " animal" in words and " it" in words


def test_translation_labels_show_characters(request):
    """The en→pt Marian's source and target pieces read "▁love", "▁amo": now " love", " amo"."""
    en_pt = common.shared_model("en-pt")
    for text in ("I love you.", ENGLISH, APPLE):
        tr = en_pt.translate(text)
        assert not _unreadable(tr.source_tokens + tr.target_tokens), (tr.source_tokens, tr.target_tokens)
    tr = en_pt.translate("I love you.")
    assert " love" in tr.source_tokens and tr.source_tokens[-1] == "</s>"
    assert "".join(tr.target_tokens).replace("</s>", "").strip() == tr.text == "Eu te amo."


@pytest.fixture(scope="module")
def smollm2_page():
    at = _run(AppTest.from_file(PAGE, default_timeout=300))
    at.selectbox(key=PICKER).set_value("smollm2")
    return _run(at)


def _sample(at, text: str):
    at.selectbox(key="attention.sample").set_value(text)
    return _run(at)


def _token_caption(at) -> str:
    return next(c.value for c in at.caption if " tokens: " in c.value)


@pytest.mark.parametrize("model_key", catalogue.text_readers("Han"))
def test_the_apple_sentence_shows_as_characters_on_every_text_model_that_reads_chinese(model_key):
    at = _run(AppTest.from_file(PAGE, default_timeout=300))
    at.selectbox(key=PICKER).set_value(model_key)
    at = _sample(_run(at), APPLE)
    shown = _token_caption(at).split(" tokens: ", 1)[1].replace("\\", "").split(" · ")
    assert not any(set(t) & set("�ÃèåæäçéïÂ") for t in shown), shown    # no byte garbage
    assert not _unreadable(shown), shown                       # no ▁, Ġ or byte pieces either
    assert not any("&lt;" in t for t in shown)                 # special tokens read <s>, as typed
    assert "".join(completed(t) for t in shown if t not in ("<s>", "</s>", "<bos>")).lstrip(" ") \
        .replace(",", "，") == APPLE                         # e5-small: NFKC makes ， a ,
    assert "苹果" in shown or ["苹", "果"] == [t for t in shown if t in ("苹", "果")]
    assert not any("vocabulary" in w.value and "[UNK]" in w.value for w in at.warning)
    held = " ".join(c.value.replace("\\", "") for c in at.caption if "hold several characters" in c.value)
    assert ("了一个 (3)" if "了一个" in shown else "一个 (2)") in held     # one token, several characters
    at = _view(at, "Find heads")
    q, k = at.selectbox(key="attention.rank_q"), at.selectbox(key="attention.rank_k")
    assert q.options[q.index].endswith(": 它") and k.options[k.index].endswith(("苹果", ": 果"))
    assert _rank_table(at).iloc[0]["weight"] > 0.4       # e5-small: layer 11, head 11 at 0.60
    ticks = _chart(_view(at, "Detail"), "attention.detail")["layout"]["yaxis"]["ticktext"]
    assert not _unreadable(ticks) and "它" in "".join(ticks) and ("苹果" in ticks or "苹" in ticks), ticks


@pytest.mark.parametrize("text", [APPLE, VASE, LOVE])
def test_the_chinese_samples_show_characters_on_smollm2(smollm2_page, text):
    """SmolLM2's byte pieces of 苹果 were shown as bytes; now as the characters they spell."""
    at = _sample(smollm2_page, text)
    assert at.session_state["attention.text"] == text
    caption = _token_caption(at)
    assert "�" not in caption and "Ã" not in caption and "è" not in caption
    shown = caption.split(" tokens: ", 1)[1].replace("\\", "").split(" · ")   # markdown escapes
    assert "".join(completed(t) for t in shown) == text
    if text == APPLE:
        assert shown[6:10] == ["苹…", "苹…", "苹", "果"]


def test_find_heads_opens_on_ta_and_pingguo_on_smollm2(smollm2_page):
    at = _view(_sample(smollm2_page, APPLE), "Find heads")
    q, k = at.selectbox(key="attention.rank_q"), at.selectbox(key="attention.rank_k")
    assert q.options[q.index].endswith(": 它") and k.options[k.index].endswith(": 果")
    # the key is 苹果's four byte pieces; the query the piece that completes 它
    assert (at.number_input(key="attention.rank_qn").value, at.number_input(key="attention.rank_kn").value) == (1, 4)
    tr = common.shared_model("smollm2").trace(APPLE)
    key_span = range(k.index - 3, k.index + 1)
    expected = head_ranking.rank_heads(tr.attentions, q.index, key_span, causal=True,
                                       content=range(len(tr.tokens)))
    ranking = _rank_table(at)
    assert ranking[["layer", "head"]].values.tolist() == expected[["layer", "head"]].values.tolist()
    top = ranking.iloc[0]
    # SmolLM2's layer 13, head 8 sends 0.77 of 它's attention to 苹果's four pieces, the other
    # words far less: a link, ranked first by contrast
    assert (top["layer"], top["head"], top["pattern"]) == (13, 8, "link") and top["weight"] > 0.75
    np.testing.assert_allclose(top["weight"], tr.attentions[13, 8, q.index, key_span].sum(), atol=1e-6)
    said = [m.value.replace("\\", "") for m in at.markdown if "links" in m.value]
    assert said[0].startswith("Layer 13, head 8 links “它” to “苹 · 果”")
    _sample(at, VASE)
    q, k = at.selectbox(key="attention.rank_q"), at.selectbox(key="attention.rank_k")
    assert q.options[q.index].endswith(": 它") and k.options[k.index].endswith(": 瓶")
    assert at.number_input(key="attention.rank_kn").value == 6          # 花瓶: 6 byte pieces


def test_minilm_warning_names_the_bundled_model_that_reads_chinese():
    """MiniLM reads most of 苹果 as [UNK]; its warning did not say which bundled model reads
    Chinese. It names the ones the catalogue lists for the text's script (SmolLM2)."""
    at = _sample(_run(AppTest.from_file(PAGE, default_timeout=180)), APPLE)
    assert at.selectbox(key=PICKER).value == "minilm"
    warning = [w.value.replace("\\", "") for w in at.warning if "vocabulary" in w.value]
    assert len(warning) == 1 and "[UNK]" in warning[0]
    assert "Of the bundled models, gemma3-270m, e5-small and smollm2 (its byte-level tokenizer spells every " \
           "character in UTF-8 bytes) read Chinese characters with no [UNK]: choose one" in warning[0]
    assert catalogue.text_readers(main_script(APPLE)) == ["smollm2", "gemma3-270m", "e5-small"]
    # English text outside nothing: no note; Cyrillic on MiniLM names SmolLM2 for that script
    at = _sample(at, "The animal didn't cross the street because it was too tired.")
    assert not any("vocabulary" in w.value for w in at.warning)
    at.text_area(key="attention.text_input").input("Привет, как дела? Это тестовое предложение.")
    at.button[0].click()
    warning = [w.value.replace("\\", "") for w in _run(at).warning if "vocabulary" in w.value]
    assert warning and "read Cyrillic script with no [UNK]" in warning[0]


def test_main_script_and_text_readers():
    assert main_script(APPLE) == "Han" and main_script("Привет мир") == "Cyrillic"
    assert main_script("hello 🍕 ｗｏｒｌｄ") == "Latin" and main_script("🍕 123") is None
    assert main_script("ひらがな") == "Kana" and main_script("한국어") == "Hangul"
    assert catalogue.text_readers("Latin") == ["minilm", "smollm2", "gemma3-270m", "e5-small"]
    assert catalogue.text_readers("Ethiopic") == ["smollm2"]       # byte-level: any script
    assert catalogue.text_readers(None) == []
    # only text models: the vision, translation and speech entries are never named
    assert set(catalogue.text_readers("Han")) <= {k for k, s in catalogue.BUNDLED.items()
                                                  if s["task"] in ("encoder", "lm")}


def test_smollm2_warning_on_chinese_says_characters_are_labelled_and_nothing_is_unknown():
    tokenizer = common.shared_model("smollm2").tokenizer
    warning = vocabulary_warning(tokenizer, APPLE, "smollm2")
    assert "split into the bytes of each character" in warning and "[UNK]" not in warning
    assert "labelled on the token that completes it" in warning


@pytest.mark.parametrize("model_key, special", [("gemma3-270m", "<bos>"), ("e5-small", "<s>")])
def test_find_heads_asks_the_vase_sentence_word_to_word(model_key, special):
    """Gemma and e5-small write 把它 as one token and 花瓶 as two: the pair opened on 好了 → 他.
    Now the query is the token holding 它 and the key the span 花 · 瓶, ranked by contrast."""
    at = _run(AppTest.from_file(PAGE, default_timeout=300))
    at.selectbox(key=PICKER).set_value(model_key)
    at = _view(_sample(_run(at), VASE), "Find heads")
    q, k = at.selectbox(key="attention.rank_q"), at.selectbox(key="attention.rank_k")
    assert q.options[q.index].endswith(": 把它") and k.options[k.index].endswith(": 瓶")
    assert at.number_input(key="attention.rank_kn").value == 2
    assert q.options[0] == f"0: {special}" and not any("&lt;" in o for o in q.options)
    said = [m.value.replace("\\", "") for m in at.markdown if "links" in m.value]
    assert said and "links “把它” to “花 · 瓶”" in said[0]
    ranking = _rank_table(at)
    assert ranking.iloc[0]["pattern"] == "link" and (ranking["contrast"].diff().dropna() <= 1e-12).all()
    if model_key == "e5-small":     # the head that sends every row to 苹果 is a column head
        at = _sample(at, APPLE)
        ranking = _rank_table(at).set_index(["layer", "head"])
        assert ranking.loc[(11, 11), "pattern"] == "column" and ranking.loc[(11, 11), "rank"] > 1
        assert ranking.loc[(11, 11), "weight"] > ranking.iloc[0]["weight"]
        assert any("Layer 11, head 11 gives “苹果” more" in m.value.replace("\\", "") for m in at.markdown)
