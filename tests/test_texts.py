"""The bundled texts load from package data and keep the shape their README promises."""

import hashlib

from attnviz.base.texts import eval_text, seed_sentences


def test_eval_text_is_the_documented_file():
    text = eval_text()
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert digest == "aa56549d1a0d758c14bc99c749c9240c4eb7d0e478ddf3aba90dad919b59c2c7"  # README
    assert text.startswith("CHAPTER I. Down the Rabbit-Hole\n\nAlice was beginning")
    assert len(text.split()) == 4245
    assert not any(mark in text for mark in ("`", "_", "\r", "  ", "*"))  # markup removed


def test_eval_text_paragraphs_are_separated_by_one_blank_line():
    paragraphs = eval_text().rstrip("\n").split("\n\n")
    assert all(p.strip() == p and p for p in paragraphs)
    assert sum(p.startswith("CHAPTER") for p in paragraphs) == 2


def test_seed_sentences():
    sentences = seed_sentences()
    assert len(sentences) == 25
    assert "The animal didn't cross the street because it was too tired." in sentences
    assert "动物没有过马路，因为它太累了。" in sentences
    assert {"我吃了一个苹果，它很甜", "他打碎了花瓶，然后把它粘好了", "I love you. In Chinese: 我爱你"} <= set(sentences)
    assert "The capital of France is" in sentences
    assert any("🚀" in s for s in sentences)
    assert not any(s.startswith("#") or not s.strip() for s in sentences)


def test_seed_sentences_returns_a_fresh_list():
    seed_sentences().clear()
    assert len(seed_sentences()) == 25
