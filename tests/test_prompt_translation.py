"""A decoder translating: Gemma 3 270M continues a two-shot prompt for "I love you." with 我爱你,
and the query that wrote 爱 looks most at "love" in the head the Translate page preselects; the
en→pt encoder-decoder's cross-attention beside it links "amo" to "love"."""
import pytest
import torch
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz.analysis import generation, prompt_translation

VIEW = "A decoder translating (Gemma, 爱 → love)"


@pytest.fixture(scope="module")
def gemma():
    return attnviz.load_model("gemma3-270m")


def test_the_prompt_is_two_examples_then_the_sentence():
    assert prompt_translation.few_shot_prompt(" I  love you. ") == (
        "English: Good morning.\nChinese: 早上好。\nEnglish: Thank you very much.\nChinese: 非常感谢。\n"
        "English: I love you.\nChinese:")
    with pytest.raises(ValueError, match="type a sentence"):
        prompt_translation.few_shot_prompt("  ")


def test_gemma_writes_ai_and_its_best_head_looks_at_love(gemma):
    result = prompt_translation.translate(gemma, "I love you.")
    assert "爱" in result.text and result.text.startswith("我爱你")
    assert result.source_words == ["I", "love", "you", "."]
    target = result.target_holding("爱")
    assert result.target_tokens[target] == "爱你"            # one token holding 爱 and 你
    layer, head, word = result.best_head(target)
    assert result.source_words[word] == "love"
    row = result.rows[target, layer, head]
    assert int(row.argmax()) == 1 and float(row[1]) > 0.7       # L5H3: 0.78
    # the rows are the generation's own: the step that wrote 爱你, summed over each word's tokens
    gen = generation.generate(gemma, result.prompt, target + 1)
    torch.testing.assert_close(result.rows[target, :, :, 1], gen.steps[target].attention[..., result.source_groups[1]].sum(-1))
    layers = result.per_layer(target)
    assert len(layers) == gemma.cfg.n_layers and layers.loc[layer, "word"] == "love"
    assert (layers["word"] == "love").sum() >= 4          # layers 5, 7, 11, 12 and 13


def test_the_en_pt_cross_attention_links_amo_to_love():
    cross = prompt_translation.cross_rows(attnviz.load_model("en-pt").translate("I love you."))
    t, layer, head, weight = cross.strongest_on("love")
    assert cross.target_words[t] == "amo" and weight > 0.9
    assert cross.strongest_on("banana") is None


def test_the_translate_page_opens_on_ai_with_the_best_head_preselected():
    at = AppTest.from_file("../pages/6_Translate.py", default_timeout=400).run()
    at.radio(key="translate.view").set_value(VIEW).run()
    assert not at.exception, at.exception
    said = [m.value.replace("\\", "") for m in at.markdown]
    assert any("It continues: **我爱你。**" in s for s in said)
    assert any("self-attention" in s and "not an encoder-decoder" in s for s in said)
    assert any(s.startswith("Writing “amo”") and "“love”" in s for s in said)
    assert at.session_state["translate.pt_sentence"] == "I love you."
    target = at.selectbox(key="translate.pt_target")
    assert target.options[target.index] == "1: 爱你 (one token, 2 characters)"
    assert (at.selectbox(key="translate.pt_layer").value, at.selectbox(key="translate.pt_head").value) == (5, 3)
    row = [c for c in at.get("plotly_chart") if c.proto.id.endswith("translate.pt_row")][0]
    import json
    import numpy as np
    bars = json.loads(row.proto.spec)["data"][0]
    y = bars["y"]
    y = np.frombuffer(__import__("base64").b64decode(y["bdata"]), dtype=y["dtype"]) if isinstance(y, dict) else np.array(y)
    assert bars["customdata"][int(np.argmax(y))] == "love"
