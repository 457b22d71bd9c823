"""Chinese as characters: byte-level pieces merged back into the characters they spell, the
founding notes' Chinese samples on the Attention page, and Find heads opening on 它 → 苹果."""
import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from attnviz.analysis import stats
from attnviz.core.tokens import (PARTIAL, SPACE, completed, labels, main_script, show, spelled_ends,
                                  vocabulary_warning)
from attnviz.ui import common
from attnviz.weights import catalogue
from tests.test_page_attention import PAGE, PICKER, _rank_table, _run, _view

APPLE = "我吃了一个苹果，它很甜"
VASE = "他打碎了花瓶，然后把它粘好了"
LOVE = "I love you. In Chinese: 我爱你"



@pytest.mark.parametrize("text", [APPLE, VASE, "ok 😀 👨‍👩‍👧 ☀️！", "Ελληνικά हिन्दी ไทย 한국어"])
def test_every_character_is_spelled_by_the_tokens_that_complete_it(bytelevel, text):
    ids = bytelevel(text)["input_ids"]
    out, _ = labels(bytelevel, ids)
    assert len(out) == len(ids) > len(text)                     # split into bytes
    assert all("�" not in o and "Ã" not in o for o in out)      # no byte garbage
    assert "".join(completed(o) for o in out) == show(text)    # spaces, ZWJ shown as symbols
    # every partial piece names the character it belongs to, which a later piece completes
    for n, o in enumerate(out):
        if o.endswith(PARTIAL):
            char = o[len(completed(o)):-len(PARTIAL)]
            assert char and any(char in completed(later) for later in out[n + 1:]), (o, out)


def test_a_piece_holding_a_space_and_the_start_of_an_emoji_says_both():
    """SmolLM2 writes " 😀" as " " + its first three bytes, then the last byte: the first piece
    was labelled "▁" alone, so the emoji's start was lost."""
    tokenizer = common.shared_model("smollm2").tokenizer
    ids = tokenizer("我爱你 😀", add_special_tokens=False)["input_ids"]
    out, _ = labels(tokenizer, ids)
    assert out[-2:] == [SPACE + "😀" + PARTIAL, "😀"]
    assert out[:7] == ["我…", "我", "爱…", "爱…", "爱", "你…", "你"]


def test_a_lone_combining_mark_is_drawn_on_a_dotted_circle(bytelevel):
    out, _ = labels(bytelevel, bytelevel("☀\ufe0f")["input_ids"])
    assert out[-1] == "◌\ufe0f" and completed(out[-1]) == "\ufe0f"


def test_spelled_ends_finds_a_word_split_over_tokens():
    pieces = ["我…", "我", "吃…", "吃", "了", "一个", "苹…", "苹…", "苹", "果", "，", "它…", "它"]
    assert spelled_ends(pieces, "苹果") == [9]
    assert spelled_ends(pieces, "它") == [12]
    assert spelled_ends(["▁the", "▁animal", "s"], "animal") == [1]
    assert spelled_ends(pieces, "梨") == [] and spelled_ends(pieces, "") == []


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
    assert "".join(completed(t) for t in shown if t not in ("&lt;s&gt;", "&lt;/s&gt;", "&lt;bos&gt;", "<bos>")).lstrip(SPACE) \
        .replace(",", "，") == APPLE                         # e5-small: NFKC makes ， a ,
    assert "苹果" in shown or ["苹", "果"] == [t for t in shown if t in ("苹", "果")]
    assert not any("vocabulary" in w.value and "[UNK]" in w.value for w in at.warning)
    at = _view(at, "Find heads")
    q, k = at.selectbox(key="attention.rank_q"), at.selectbox(key="attention.rank_k")
    assert q.options[q.index].endswith(": 它") and k.options[k.index].endswith(("苹果", ": 果"))
    assert _rank_table(at).iloc[0]["weight"] > 0.4       # e5-small: layer 11, head 11 at 0.60


@pytest.mark.parametrize("text", [APPLE, VASE, LOVE])
def test_the_chinese_samples_show_characters_on_smollm2(smollm2_page, text):
    """SmolLM2's byte pieces of 苹果 were shown as bytes; now as the characters they spell."""
    at = _sample(smollm2_page, text)
    assert at.session_state["attention.text"] == text
    caption = _token_caption(at)
    assert "�" not in caption and "Ã" not in caption and "è" not in caption
    shown = caption.split(" tokens: ", 1)[1].replace("\\", "").split(" · ")   # markdown escapes
    assert "".join(completed(t) for t in shown).replace(SPACE, " ") == text
    if text == APPLE:
        assert shown[6:10] == ["苹…", "苹…", "苹", "果"]


def test_find_heads_opens_on_ta_and_pingguo_on_smollm2(smollm2_page):
    at = _view(_sample(smollm2_page, APPLE), "Find heads")
    q, k = at.selectbox(key="attention.rank_q"), at.selectbox(key="attention.rank_k")
    assert q.options[q.index].endswith(": 它") and k.options[k.index].endswith(": 果")
    tr = common.shared_model("smollm2").trace(APPLE)
    expected = stats.rank_heads(tr.attentions, q.index, k.index, causal=True)
    ranking = _rank_table(at)
    assert ranking[["layer", "head"]].values.tolist() == expected[["layer", "head"]].values.tolist()
    top = ranking.iloc[0]
    # SmolLM2's layer 13, head 8 sends 它's attention to 苹果: 0.42 on 果, 0.77 over its 4 pieces
    assert (top["layer"], top["head"]) == (13, 8) and top["weight"] > 0.4
    pieces = tr.attentions[13, 8, q.index, k.index - 3: k.index + 1].numpy()
    assert pieces.sum() > 0.75
    np.testing.assert_allclose(top["weight"], tr.attentions[13, 8, q.index, k.index], atol=1e-6)
    _sample(at, VASE)
    q, k = at.selectbox(key="attention.rank_q"), at.selectbox(key="attention.rank_k")
    assert q.options[q.index].endswith(": 它") and k.options[k.index].endswith(": 瓶")


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
