"""Readable labels: byte-level pieces decoded, CJK and emoji intact, specials kept, no mojibake."""
import pytest

import attnviz
from attnviz.core.tokens import (FRAGMENT_MAX_CHARS_PER_TOKEN, OUTSIDE_WARN_SHARE, labels, plain, show,
                            vocabulary_coverage, vocabulary_warning)



def test_bytelevel_english_has_space_marker(bytelevel):
    ids = bytelevel("the cat")["input_ids"]
    out, special = labels(bytelevel, ids)
    assert "".join(out) == "the cat" and out[-1] == " cat"     # a plain word space, no Ġ
    assert not any(special)


def test_bytelevel_cjk_and_emoji_never_mojibake(bytelevel):
    text = "猫🐈 ok"
    ids = bytelevel(text)["input_ids"]
    assert len(ids) > 4  # split into bytes
    out, _ = labels(bytelevel, ids)
    assert all("�" not in o and "Ã" not in o for o in out)
    complete = [o for o in out if not o.endswith("…")]
    assert plain("".join(complete)) == text      # a lone space token reads "␣"
    assert out[0] == "猫…" and "猫" in out


def test_special_tokens_labelled(bytelevel):
    ids = bytelevel("the")["input_ids"] + [bytelevel.eos_token_id]
    out, special = labels(bytelevel, ids)
    assert out[-1] == "<|endoftext|>" and special[-1] and not special[0]


def test_invisible_characters_are_shown():
    assert show("a\tb\n") == "a⇥b↵"
    assert show("a\u200bb") == "a⟨U+200B⟩b"
    assert show("\x07") == "⟨U+0007⟩"
    assert show("שלום") == "שלום"


@pytest.fixture(scope="module")
def minilm():
    return attnviz.load_model("minilm")


def test_minilm_labels_and_specials(minilm):
    tr = minilm.trace("Playing with 中国 and 🐈!", attentions=False)
    assert tr.tokens[0] == "[CLS]" and tr.tokens[-1] == "[SEP]"
    assert "中" in tr.tokens and "国" in tr.tokens  # MiniLM's vocabulary has no emoji
    assert [t for t, s in zip(tr.tokens, tr.special.tolist()) if s] == ["[CLS]", "[UNK]", "[SEP]"]


def test_truncation_is_reported(minilm):
    tr = minilm.trace("word " * 700, attentions=False)
    assert tr.n == 512 and tr.truncated > 0


def test_a_long_text_is_tokenized_once_and_cut_as_the_tokenizer_cuts(minilm, monkeypatch):
    """Encode_text tokenized a text twice when it had to cut it (100k CJK: 3.8 s each)."""
    text = "word " * 700
    reference = minilm.tokenizer(text, truncation=True, max_length=512)["input_ids"]
    full = len(minilm.tokenizer(text)["input_ids"])
    calls = []
    real = type(minilm.tokenizer).__call__

    def counted(self, *args, **kwargs):
        calls.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(minilm.tokenizer), "__call__", counted)
    ids, dropped = minilm.encode_text(text)
    assert len(calls) == 1
    assert ids.tolist() == reference and dropped == full - 512 == 190
    short, none = minilm.encode_text("word " * 10)
    assert short.tolist() == real(minilm.tokenizer, "word " * 10)["input_ids"] and none == 0


LONE_SURROGATE = "caf\ud83d latte"  # half of an emoji's UTF-16 pair, as a cut clipboard leaves it


@pytest.mark.parametrize("call", ["trace", "encode_text", "capture_text", "single_token", "check_text"])
def test_a_lone_surrogate_is_a_value_error_saying_what_to_do(minilm, call):
    """The tokenizer's TypeError escaped from every text entry point."""
    from attnviz.analysis import capture, effects
    from attnviz.core.tokens import check_text
    run = {"trace": minilm.trace, "encode_text": minilm.encode_text, "check_text": check_text,
           "capture_text": lambda text: capture.capture_text(minilm, text),
           "single_token": lambda text: effects.single_token(minilm.tokenizer, " \ud83d")}[call]
    with pytest.raises(ValueError, match=r"lone surrogate, U\+D83D.*delete it or paste the text again"):
        run(LONE_SURROGATE)
    assert check_text("café 🐈 latte") == "café 🐈 latte"


@pytest.mark.parametrize("text", ["", "   \n\t"])
def test_empty_text_refused(minilm, text):
    with pytest.raises(ValueError, match="empty"):
        minilm.trace(text)


@pytest.mark.parametrize("text", ["\u202eabc\u202c", "\x00\x01\x02 hi", "🐈" * 300, "x" * 6000,
                                  "{{ user }} {% if %} <script>alert(1)</script>"])
def test_odd_text_traces(minilm, text):
    tr = minilm.trace(text)
    assert tr.attentions.shape[-1] == tr.n == len(tr.tokens)


# --- Mostly outside the vocabulary ----------------------------------------------------------------
CYRILLIC = "Привет, как дела? Это тестовое предложение на русском языке."
ENGLISH = [
    "The animal didn't cross the street because it was too tired.",
    "Antidisestablishmentarianism and xylophones in 2024: 1234567 q.e.d. U.S.A., e.g. DNA-PKcs, mRNA",
    "def f(x): return np.linalg.norm(x_ij)  # TODO: fix the k_v_cache",
    "I a an to be or no.",
]


def test_minilm_spells_cyrillic_letter_by_letter_and_is_warned(minilm):
    coverage = vocabulary_coverage(minilm.tokenizer, CYRILLIC)
    assert coverage.words == 9 and coverage.spelled_out == 9 and coverage.share == 1.0
    assert coverage.mostly_outside and coverage.examples[0] == "Привет"
    warning = vocabulary_warning(minilm.tokenizer, CYRILLIC, "minilm")
    assert "outside minilm's vocabulary" in warning and "100%" in warning and "Привет" in warning


def test_minilm_emoji_are_unknown_and_warned(minilm):
    coverage = vocabulary_coverage(minilm.tokenizer, "🍕🍕🐈 😀")
    assert coverage.unknown == 2 and coverage.words == 0 and coverage.share == 1.0
    assert vocabulary_warning(minilm.tokenizer, "🍕🍕🐈 😀", "minilm") is not None
    mixed = "I love pizza and cats, they make me happy 🍕"              # one emoji among words
    assert vocabulary_warning(minilm.tokenizer, mixed, "minilm") is None


@pytest.mark.parametrize("text", ENGLISH)
def test_english_is_not_warned(minilm, text):
    coverage = vocabulary_coverage(minilm.tokenizer, text)
    assert coverage.share < OUTSIDE_WARN_SHARE / 2
    assert vocabulary_warning(minilm.tokenizer, text, "minilm") is None


def test_byte_level_model_is_judged_by_pieces_per_word():
    smollm2 = attnviz.load_model("smollm2")
    assert vocabulary_coverage(smollm2.tokenizer, CYRILLIC).mostly_outside     # byte pieces
    assert vocabulary_coverage(smollm2.tokenizer, "你好世界，今天天气很好").share == 1.0
    for text in ENGLISH:
        assert vocabulary_warning(smollm2.tokenizer, text, "smollm2") is None
    assert vocabulary_coverage(smollm2.tokenizer, "🍕" * 5).letters == 0      # no [UNK]: bytes


def test_the_rule_is_characters_per_piece(bytelevel):
    # The tiny BPE above knows "the cat sat on the mat": those words are whole tokens, any other
    # word falls apart into single bytes (1 character per piece < FRAGMENT_MAX_CHARS_PER_TOKEN).
    assert FRAGMENT_MAX_CHARS_PER_TOKEN == 1.5
    inside = vocabulary_coverage(bytelevel, "the cat sat on the mat")
    assert inside.spelled_out == 0 and not inside.mostly_outside
    outside = vocabulary_coverage(bytelevel, "zebra quokka the")
    assert outside.spelled_out == 2 and outside.outside == 11 and outside.letters == 14
    assert outside.mostly_outside
