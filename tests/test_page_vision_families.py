"""The Images page opens and runs on a tiny model of every vision family (AppTest): each laid out in
a Hugging Face cache and picked by name; the two-tower families (CLIP, SigLIP) also score typed
captions against the photo in their joint view."""
import json
from pathlib import Path

import numpy as np
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

import attnviz
from tests import hub_cache
from tests.test_page_attention import _array
from tests.test_image_text import save_blip, save_dual
from tests.test_parity import VISION

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "3_Images.py")
PICK = "model_choice:vision"
DUAL = ["clip", "siglip"]
ROWS = [*VISION, *DUAL, "blip"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with hub_cache.offline_cache(tmp_path_factory.mktemp("hf") / "hub") as root:
        for row in ROWS:
            folder = tmp_path_factory.mktemp(row)
            if row in DUAL:
                save_dual(folder, row)
            elif row == "blip":
                save_blip(folder)
            else:
                hub_cache.model_folder(folder, row)
            hub_cache.lay_out(root, f"org/{row}", folder)
        yield root


def opened(row) -> AppTest:
    st.cache_resource.clear()
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.session_state[PICK] = f"org/{row}"
    at.run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    return at


@pytest.mark.parametrize("row", ROWS)
def test_images_page_runs_on_every_vision_family(row, cache):
    at = opened(row)
    assert at.get("image"), "the CLS → patches view drew its overlays"
    for view in ("Patch query", "Rollout & saliency", "Attention distance"):
        at.button_group(key="images.view_choice").set_value(view).run()
        assert not at.exception and not at.error, (view, at.exception, [e.value for e in at.error])


@pytest.mark.parametrize("row", DUAL)
def test_captions_are_scored_against_the_photo(row, cache):
    at = opened(row)
    at.button_group(key="images.view_choice").set_value("Image ↔ captions").run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    at.text_area(key="images.captions").input("a photo of cat\nthe dog on mat\na red car").run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    bars = at.get("plotly_chart")[0].proto.spec
    assert "a red car" in bars and "the dog on mat" in bars
    assert any("Best match" in m.value for m in at.markdown)
    at.text_area(key="images.captions").input("  \n ").run()
    assert [e.value for e in at.error] == ["type at least one caption, one per line"]


@pytest.mark.parametrize("row", DUAL)
def test_the_text_towers_attention_is_shown_per_head_for_a_chosen_caption(row, cache):
    """The joint view's text side: the chosen caption's attention in the chosen layer and head is
    the text tower's own trace (causal for CLIP, the future greyed; both ways for SigLIP)."""
    at = opened(row)
    at.button_group(key="images.view_choice").set_value("Image ↔ captions").run()
    at.text_area(key="images.captions").input("a photo of cat\nthe dog on mat\na red car").run()
    at.selectbox(key="images.caption_i").set_value(1).run()
    at.slider(key="images.text_layer").set_value(1).run()
    at.slider(key="images.text_head").set_value(2).run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    [spec] = [json.loads(c.proto.spec) for c in at.get("plotly_chart")
              if "text layer 1, head 2" in c.proto.spec]
    shown = _array(spec["data"][0]["z"])
    model = attnviz.load_model(f"org/{row}")
    want = model.text_model.trace(model.caption_ids("the dog on mat")).attentions[1, 2].numpy()
    np.testing.assert_allclose(shown, want, atol=1e-6)
    causal = row == "clip"
    assert model.joint.text.causal == causal and (np.abs(np.triu(want, 1)).max() == 0) == causal
    assert len(spec["data"]) == 1 + causal   # the future greyed where the tower is causal


def test_words_read_the_photo_per_head_with_heads_switchable(cache):
    at = opened("blip")
    at.button_group(key="images.view_choice").set_value("Words → patches").run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    at.text_input(key="images.blip_text").input("a photo of cat on the mat").run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert not at.metric[0].proto.delta
    captions = [c for image in at.get("image") for c in image.captions]
    assert any("“cat” as the query" in c for c in captions) is False    # word 0 ([CLS]) is the query at first
    at.selectbox(key="images.word").set_value(4).run()
    captions = [c for image in at.get("image") for c in image.captions]
    assert any("“cat” as the query" in c for c in captions), captions
    assert len(at.get("image")[1].captions) == 9                          # every token's mean map
    at.multiselect(key="images.cross_off").select("L0.H1").select("L1.H0").run()
    assert not at.exception and not at.error
    assert "with 2 cross-attention heads off" in at.metric[0].proto.delta  # the match beside the full model's
