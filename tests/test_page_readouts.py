"""Readouts page (AppTest, SmolLM2): logit lens, attribution with heads switched off, generation,
two prompts; the view choice is remembered and only the chosen view computes; bad input."""
import json
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from attnviz.analysis import head_ablation, patching, readouts
from attnviz.analysis.effects import single_token
from attnviz.ui import kept_inputs
from attnviz.weights import catalogue

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "8_Readouts.py")
TEXT = "When Mary and John went to the store, John gave a drink to"


@pytest.fixture(scope="module")
def smollm2():
    return catalogue.load_model("smollm2")


def app() -> AppTest:
    return AppTest.from_file(PAGE, default_timeout=300).run()


def chart(at, key):
    return json.loads(next(c for c in at.get("plotly_chart") if c.key == key).proto.spec)


def view(at, name):
    return at.radio(key="readouts.view").set_value(name).run()


def test_logit_lens_view(smollm2):
    at = app()
    assert not at.exception and not at.error
    lens = readouts.logit_lens(smollm2, TEXT)
    fig = chart(at, "readouts.lens_chart")
    assert fig["layout"]["yaxis"]["ticktext"][0] == "embed" and len(fig["layout"]["yaxis"]["ticktext"]) == 31
    mary = single_token(smollm2.tokenizer, " Mary")[0]
    assert int(lens.final_ids[-1]) == mary
    assert any(f"first top-1 at **{lens.rows[lens.first_top1(mary)]}**" in c.value for c in at.caption)
    bars = chart(at, "readouts.lens_top")
    assert "L29 out at position 13" in bars["layout"]["title"]["text"]
    at.selectbox(key="readouts.lens_row").set_value(12).run()
    assert not at.exception
    assert "L11 out" in chart(at, "readouts.lens_top")["layout"]["title"]["text"]
    assert not at.metric  # the attribution view did not run
    assert any(b.proto.label == "Logit lens CSV" for b in at.get("download_button"))


def test_attribution_view_and_switching_heads_off(smollm2):
    at = view(app(), "Attribution")
    assert not at.exception and not at.error
    metrics = {m.label: m.value for m in at.metric}
    target, minus = (single_token(smollm2.tokenizer, t)[0] for t in (" Mary", " John"))
    att = readouts.attribution(smollm2, TEXT, target, minus)
    assert float(metrics["Model's logit difference"]) == pytest.approx(att.logit_diff, abs=1e-3)
    assert abs(float(metrics["Sum of the parts"]) - float(metrics["Model's logit difference"])) < 1e-3
    assert any("frozen" in c.value and "TransformerLens" in c.value for c in at.caption)
    fig = chart(at, "readouts.dla_map")
    assert len(fig["data"]) == 2  # heads and MLPs beside them
    at.button(key="readouts.top_off").click().run()
    assert not at.exception
    keep = readouts.top_off_mask(att, 5)
    lg = head_ablation.logits(smollm2, TEXT, keep, "zero")[-1]
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["Logit difference"]) == pytest.approx(float(lg[target] - lg[minus]), abs=1e-3)
    assert any("Zero ablation" in c.value for c in at.caption)
    at.radio(key="readouts.ablation").set_value("mean").run()
    assert not at.exception
    means = head_ablation.head_means(smollm2)
    lg = head_ablation.logits(smollm2, TEXT, keep, "mean", means)[-1]
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["Logit difference"]) == pytest.approx(float(lg[target] - lg[minus]), abs=1e-3)
    assert any("Mean ablation" in c.value for c in at.caption)
    at.button(key="readouts.to_heads").click().run()
    assert at.session_state["heads.applied:smollm2:30x9"] == at.session_state["readouts.applied:smollm2:30x9"]


def test_generation_view_with_heads_off(smollm2):
    at = view(app(), "Attribution")
    at.button(key="readouts.top_off").click().run()
    at = view(at, "Generation")
    assert not at.exception and not at.error
    at.number_input(key="readouts.gen_n").set_value(6)   # inside the form: sent with the submit
    at.checkbox(key="readouts.gen_compare").check()
    at.button(key="readouts.gen_go").click().run()
    assert not at.exception and not at.error
    texts = [m.value for m in at.markdown if m.value.startswith("**")]
    assert len(texts) == 2 and "every head on" in texts[0] and "5 head" in texts[1]
    bars = chart(at, "readouts.gen_bars")
    assert bars["layout"]["title"]["text"].startswith("Step 0: chose")
    rows = chart(at, "readouts.gen_rows")
    assert len(rows["layout"]["xaxis"]["ticktext"]) == len(smollm2.tokenizer(TEXT)["input_ids"])
    at.button(key="readouts.gen_forward").click().run()
    assert not at.exception and at.session_state["readouts.gen_step"] == 1
    assert chart(at, "readouts.gen_bars")["layout"]["title"]["text"].startswith("Step 1:")
    assert any("differ" in c.value or "agree" in c.value for c in at.caption)


def test_two_prompts_view():
    at = view(app(), "Two prompts")
    assert not at.exception and not at.error
    assert any("position by position" in c.value for c in at.caption)
    assert chart(at, "readouts.pair_head_0") and chart(at, "readouts.pair_head_1")
    at.text_area(key="readouts.pair_b").input("The golden trophy didn't fit in the suitcase because it was too big")
    at.button(key="readouts.pair_go").click().run()
    assert not at.exception
    assert any("word by word" in c.value for c in at.caption)
    at = view(at, "Logit lens")
    assert at.radio(key="readouts.view").value == "Logit lens"


def test_attribution_targets_follow_the_prompt():
    """The sample's " Mary" / " John" belong to the sample: a new prompt gets the model's own two
    most likely next tokens; a token the user typed stays while the prompt does."""
    at = view(app(), "Attribution")
    assert (at.text_input(key="readouts.target").value, at.text_input(key="readouts.minus").value) == (" Mary", " John")
    at.text_area(key="readouts.text").input("The capital of France is")
    at.button(key="readouts.run").click().run()
    assert not at.exception and not at.error
    assert (at.text_input(key="readouts.target").value, at.text_input(key="readouts.minus").value) == (" Paris", " the")
    at.text_input(key="readouts.minus").input(" Lyon").run()
    at = view(view(at, "Logit lens"), "Attribution")
    assert at.text_input(key="readouts.minus").value == " Lyon" and not at.error
    at.text_area(key="readouts.text").input(TEXT)
    at.button(key="readouts.run").click().run()
    assert (at.text_input(key="readouts.target").value, at.text_input(key="readouts.minus").value) == (" Mary", " John")


def test_bad_input():
    at = view(app(), "Attribution")
    at.text_input(key="readouts.target").input("Mary Poppins").run()
    assert not at.exception and at.error and "not one" in at.error[0].value
    at.text_area(key="readouts.text").input("   ")
    at.button(key="readouts.run").click().run()
    assert not at.exception and at.info


def test_the_longest_prompt_gets_a_message_on_every_view(smollm2):
    """Every Readouts view refuses more than 256 tokens with the page's message before any block
    runs (generation once captured every layer's [H, n, n], two prompts asked torch for a 72 GB
    buffer at 8,192). The box, kept in the page's link, takes at most 2,000 characters: a longer
    paste is refused by the box and the prompt stays as it was."""
    at = app()
    at.text_area(key="readouts.text").input("When Mary and John went to the store, " * 1200)  # 8,192 tokens
    at.button(key="readouts.run").click().run()
    assert not at.exception and at.session_state["readouts.text"] == TEXT
    long = ("When Mary and John went to the store, " * 60)[:kept_inputs.LINK_CHARS]
    n = len(smollm2.inputs(long)["ids"])
    assert n > 256
    at.text_area(key="readouts.text").input(long)
    at.button(key="readouts.run").click().run()
    assert not at.exception and f"the text has {n} tokens; readouts take at most 256" in at.error[0].value
    at = view(at, "Attribution")
    assert not at.exception and "readouts take at most 256" in at.error[0].value
    at = view(at, "Generation")
    at.button(key="readouts.gen_go").click().run()
    assert not at.exception and f"the prompt has {n:,} tokens; generation takes at most 256" in at.error[0].value
    at = view(at, "Two prompts")
    at.text_area(key="readouts.pair_b").input(long)
    at.button(key="readouts.pair_go").click().run()
    assert not at.exception
    assert f"the second prompt has {n:,} tokens; two prompts take at most 256 each" in at.error[0].value


def test_the_target_token_box_is_capped_before_tokenising():
    """Readouts › Attribution: 100,000 pasted characters were tokenised on every rerun and the refusal
    quoted every token (3.2 MB sent to the browser each time)."""
    from attnviz.analysis import effects
    tok = catalogue.load_model("smollm2").tokenizer
    with pytest.raises(ValueError, match="100,000 characters are far more than one token"):
        effects.single_token(tok, "字" * 100_000)
    with pytest.raises(ValueError) as err:
        effects.single_token(tok, " Mary had a little lamb whose fleece was white as snow")
    message = str(err.value)                                   # 12 tokens: the first 8 quoted, then a count
    assert "is 12 tokens" in message and "'ce' + 4 more), not one" in message and "▁" not in message \
        and message.startswith("' Mary had a little lamb whose fleece was white as snow' is 12 tokens for this model (' Mary' + ' had' + ")
    at = view(app(), "Attribution")
    box = at.text_input(key="readouts.target")
    assert box.proto.max_chars == effects.TOKEN_CHARS


def test_images_rollout_with_artefacts_discounted():
    """The Images page's rollout with DINOv2's high-norm artefact patches discounted and outlined."""
    at = AppTest.from_file(str(Path(PAGE).parent / "3_Images.py"), default_timeout=300).run()
    at.button_group(key="images.view_choice").set_value("Rollout & saliency").run()
    at.checkbox(key="images.discount").check().run()
    assert not at.exception
    captions = [t for image in at.get("image") for t in image.captions]
    assert any("artefact patch(es) discounted, outlined" in c for c in captions)
    at.button_group(key="images.view_choice").set_value("CLS → patches").run()
    at.checkbox(key="images.outline").check().run()
    assert not at.exception
    assert any("artefact patch(es) outlined" in t for image in at.get("image") for t in image.captions)


def test_attention_lines_view_windows_a_long_text():
    """The Attention page's lines view on a long text: a window of labelled tokens that follows the query."""
    at = AppTest.from_file(str(Path(PAGE).parent / "1_Attention.py"), default_timeout=300).run()
    at.text_area(key="attention.text_input").input(" ".join(["the cat sat on the mat and looked around"] * 12))
    at.button[0].click().run()
    at.radio(key="attention.view").set_value("Lines").run()
    assert not at.exception
    spec = chart(at, "attention.lines")
    labels = [t for t in spec["data"] if t.get("mode") == "markers+text"]
    assert [len(t["text"]) for t in labels] == [48, 48]
    assert [a["text"] for a in spec["layout"]["annotations"]] == ["<b>queries</b>", "<b>keys</b>"]
    assert "→" in labels[0]["customdata"][-1]
    at.selectbox(key="attention.line_q").set_value(10).run()
    assert not at.exception
    start = at.slider(key="attention.line_start").value
    assert start <= 10 < start + 48
    assert any("Hover a token" in c.value for c in at.caption)


def test_heads_page_live_effect_and_importance_say_their_ablation():
    """The Heads page: one choice of zero or mean ablation; the live effect and importance say which."""
    at = AppTest.from_file(str(Path(PAGE).parent / "2_Heads.py"), default_timeout=600).run()
    assert not at.exception
    row = at.button_group(key="heads.row:minilm:6x12:1")
    row.unselect(3).run()
    at.button(key="heads.apply").click().run()
    zero = next(m.value for m in at.metric if m.label.startswith("embedding cosine"))
    assert any("zero ablation" in c.value for c in at.caption)
    at.radio(key="heads.ablation").set_value("mean").run()
    assert not at.exception
    mean = next(m.value for m in at.metric if m.label.startswith("embedding cosine"))
    assert any("mean ablation" in c.value for c in at.caption) and mean != zero
    at.select_slider(key="heads.imp_tokens").set_value(32)
    at.select_slider(key="heads.imp_window").set_value(32)
    at.radio(key="heads.imp_method").set_value("ablation")
    at.button(key="heads.imp_go").click().run()
    assert not at.exception and not at.error
    assert any("heads off by mean ablation" in c.value for c in at.caption)
    assert chart(at, "heads.imp_map")["layout"]["title"]["text"] == "ablation importance, mean ablation"
    at.button_group(key="heads.tool").set_value("Pruning curve").run()
    at.select_slider(key="heads.curve_tokens").set_value(32)
    at.select_slider(key="heads.curve_window").set_value(32)
    at.number_input(key="heads.curve_seeds").set_value(1)
    at.button(key="heads.curve_go").click().run()
    assert not at.exception and not at.error
    assert chart(at, "heads.curve_cosine")["layout"]["title"]["text"] == "cosine: heads removed by mean ablation"


def test_patching_view_on_the_mary_john_sample(smollm2):
    at = view(app(), "Patching")
    assert not at.exception and not at.error
    at.radio(key="readouts.patch_kind").set_value("k").run()
    at.button(key="readouts.patch_run").click().run()
    assert not at.exception and not at.error
    spec = chart(at, "readouts.patch_map")
    pair = patching.prepare(smollm2, patching.SAMPLE_CLEAN, patching.SAMPLE_CORRUPTED, " Mary", " John")
    want = patching.patch_map(smollm2, pair, "k", units={23: [0]})
    assert abs(spec["data"][0]["z"][23][0] - float(want.recovered[23, 0])) < 1e-4
    at.run()  # a rerun (the CSV download, another widget) keeps the map
    assert chart(at, "readouts.patch_map")["data"][0]["z"] == spec["data"][0]["z"]
    at.text_input(key="readouts.patch_corrupted").input("When Mary went to the store").run()
    assert not at.exception and "same length" in at.error[0].value
