"""The model picker's models by name (AppTest): the cached ones listed, "Hub model…" only where
downloads are allowed, a cached model loaded and shown by the pages, a download sized first and
fetched on a click (the Hub replaced by stand-ins: no network here)."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attnviz.ui import common
from tests import hub_cache
from tests.test_hub import cache, fake_download, online  # noqa: F401  (fixtures)

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PICK = "model_choice:encoder/lm/vision"


def home(**state) -> AppTest:
    import streamlit as st
    st.cache_resource.clear()
    st.cache_data.clear()
    at = AppTest.from_file(APP, default_timeout=300)
    for key, value in state.items():
        at.session_state[key] = value
    return at.run()


def errors(at) -> list[str]:
    return [e.value for e in at.error]


@pytest.fixture
def two_cached(cache, tmp_path):
    hub_cache.model_folder(tmp_path / "lm")
    hub_cache.lay_out(cache, "org/tiny", tmp_path / "lm")
    hub_cache.model_folder(tmp_path / "vit", "vit")
    hub_cache.lay_out(cache, "org/vision", tmp_path / "vit")
    return cache


def test_the_picker_lists_cached_models_and_offers_hub_model_only_when_downloads_are_on(two_cached, set_limits):
    at = home(**{PICK: "org/tiny"})
    assert not at.exception and not errors(at)
    options = at.sidebar.selectbox(key=PICK).options
    assert "org/tiny" in options and "org/vision" in options and "Hub model…" not in options
    set_limits(hub=True, hub_allow="Qwen/*")
    at = home(**{PICK: "org/tiny"})
    assert "Hub model…" in at.sidebar.selectbox(key=PICK).options
    at.switch_page("pages/1_Attention.py").run()           # a text page lists only text models
    assert not at.exception
    options = at.sidebar.selectbox(key="model_choice:encoder/lm").options
    assert "org/tiny" in options and "org/vision" not in options


def test_without_a_cache_the_picker_is_as_before(cache):
    at = home(**{PICK: "toy-copy"})
    assert not at.exception
    assert not [o for o in at.sidebar.selectbox(key=PICK).options if "/" in o or o == "Hub model…"]


def test_a_cached_model_loads_and_the_attention_page_renders(two_cached):
    at = home(**{PICK: "org/tiny"})
    assert not at.exception and not errors(at)
    assert "Loaded: org/tiny" in [h.value for h in at.subheader]
    at.switch_page("pages/1_Attention.py").run()
    assert not at.exception and not errors(at)
    assert at.sidebar.selectbox(key="model_choice:encoder/lm").value == "org/tiny"
    assert at.get("plotly_chart") or at.get("imgs")


def test_hub_model_sizes_a_download_and_fetches_it_on_a_click(online, cache, tmp_path):
    src = tmp_path / "src"
    hub_cache.model_folder(src)
    calls = online({p.name: p.stat().st_size for p in src.iterdir()}, fetch=fake_download(cache, src))
    at = home(**{PICK: "Hub model…", "model_hub_name": "Qwen/tiny"})
    assert not at.exception and not errors(at)
    assert any("Not in this server's cache yet" in c.value and "safetensors weights" in c.value for c in at.caption)
    assert calls == []                                     # sized, not fetched
    at.button(key="hub_download").click().run()
    assert not at.exception and not errors(at)
    assert len(calls) == 1 and "Loaded: Qwen/tiny" in [h.value for h in at.subheader]
    at.run()                                               # from the cache now: no Download button
    assert not at.exception and len(calls) == 1 and not [b for b in at.button if b.key == "hub_download"]


@pytest.mark.parametrize("typed, message", [("evil/tiny", "allow-list"), ("a/b/c", "not a Hugging Face model name"),
                                            ("", None)])
def test_hub_model_refusals_are_messages(online, typed, message):
    at = home(**{PICK: "Hub model…", "model_hub_name": typed})
    assert not at.exception
    if message is None:
        assert not errors(at) and any("Type a model name" in i.value for i in at.info)
    else:
        [shown] = errors(at)
        assert common.plain(message) in shown and common.plain(typed) in shown
