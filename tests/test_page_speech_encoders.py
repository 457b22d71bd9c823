"""AppTest of the Speech page with a speech encoder: tiny random wav2vec2 (with a CTC head and its
letters tokenizer) and HuBERT models laid out in a Hugging Face cache, picked by name, hear the
bundled clip; the frames x frames map of a head equals the model's own trace, every view runs, and
heads switched off in the shared editor move the frames' outputs."""
import base64
import json
from pathlib import Path

import numpy as np
import pytest
import streamlit as st
import transformers as tf
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz.ui.speech_page import CLIP, KINDS
from tests import hub_cache
from tests.test_parity import VOCAB, tiny

PAGE = str(Path(__file__).resolve().parent.parent / "pages" / "7_Speech.py")
PICK = "model_choice:audio"
STRIDES = (5, 8, 8)       # 320 samples a frame: 20 ms, as the real models' frames
LETTERS = ["<pad>", "<s>", "</s>", "<unk>", "|", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ'"]


def ctc_tokenizer(folder: Path) -> tf.Wav2Vec2CTCTokenizer:
    """Letters first, then fillers up to the tiny model's vocabulary (transformers' own CTC tokenizer)."""
    vocab = {t: i for i, t in enumerate(LETTERS + [f"x{i}" for i in range(len(LETTERS), VOCAB)])}
    (folder / "letters.json").write_text(json.dumps(vocab))
    tok = tf.Wav2Vec2CTCTokenizer(str(folder / "letters.json"))
    (folder / "letters.json").unlink()
    return tok


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with hub_cache.offline_cache(tmp_path_factory.mktemp("hf") / "hub") as root:
        for row in ("wav2vec2_ctc", "hubert"):
            folder = tmp_path_factory.mktemp(row)
            tiny(row, conv_stride=STRIDES).save_pretrained(folder)
            tf.Wav2Vec2FeatureExtractor().save_pretrained(folder)
            if row == "wav2vec2_ctc":
                ctc_tokenizer(folder).save_pretrained(folder)
            hub_cache.lay_out(root, f"org/{row}", folder)
        yield root


def open_page(row: str) -> AppTest:
    st.cache_resource.clear()
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.session_state["speech.kind"] = KINDS[1]
    at.session_state[PICK] = f"org/{row}"
    at.run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    return at


def chart(at, key: str) -> dict:
    charts = {c.key: c for c in at.get("plotly_chart")}
    assert key in charts, list(charts)
    return json.loads(charts[key].proto.spec)


def values(z) -> np.ndarray:
    if isinstance(z, dict):   # plotly's typed array: base64 of the raw numbers
        shape = [int(n) for n in str(z.get("shape", "-1")).split(",")]   # "191, 191"
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(shape)
    return np.asarray(z, dtype=float)


def view(at, name: str) -> AppTest:
    at.radio(key="speech.view").set_value(name).run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    return at


@pytest.mark.parametrize("row", ["wav2vec2_ctc", "hubert"])
def test_a_heads_frames_map_is_the_models_own(row, cache):
    at = open_page(row)
    model = attnviz.load_model(f"org/{row}")
    tr = model.trace(CLIP.read_bytes())
    assert tr.n == 191 and tr.seconds_per_token == 0.02   # 3.82 s in 20 ms frames
    assert [m.value for m in at.metric if m.label == "frames"] == ["191"]
    at.selectbox(key="speech.encoder_head").set_value("L1H2").run()
    assert not at.exception, at.exception
    heat = chart(at, "speech.encoder_frames")["data"][1]
    assert np.abs(values(heat["z"]) - tr.attentions[1, 2].numpy()).max() < 1e-5
    assert any(m.value.startswith("**CTC reading:**") for m in at.markdown) == (row == "wav2vec2_ctc")
    view(at, "Every head")
    chart(at, "speech.encoder_grid")


def test_heads_switched_off_move_the_frames_outputs(cache):
    at = view(open_page("wav2vec2_ctc"), "Switch heads off")
    rows = sorted(b.key for b in at.button_group if b.key.startswith("speech.row:"))
    assert len(rows) == 2
    at.button_group(key=rows[0]).set_value([]).run()
    at.button(key="speech.apply").click().run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    moved = values(chart(at, "speech.encoder_change")["data"][0]["y"])
    assert len(moved) == 191 and moved.max() > 1e-3
    assert any(m.value.startswith("**CTC reading with those heads off:**") for m in at.markdown)
    chart(at, "speech.encoder_off_grid")


def test_no_speech_encoder_on_the_server_says_so(tmp_path):
    with hub_cache.offline_cache(tmp_path / "empty"):
        st.cache_data.clear()
        at = AppTest.from_file(PAGE, default_timeout=300)
        at.session_state["speech.kind"] = KINDS[1]
        at.run()
    assert not at.exception, at.exception
    assert any("No audio model is available" in i.value for i in at.info)


def test_a_clip_longer_than_the_capture_budget_holds_is_cut_with_a_warning(cache, set_limits):
    """1 MB holds 2 layers x 4 heads of 181 x 181 frames: the clip's first 3.62 s."""
    set_limits(max_capture_mb=1)
    at = open_page("hubert")
    assert [m.value for m in at.metric if m.label == "frames"] == ["181"]
    assert any("only its first 3.6 s are encoded" in w.value for w in at.warning)
