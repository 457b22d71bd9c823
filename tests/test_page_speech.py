"""AppTest of pages/7_Speech.py with the bundled whisper-tiny-en: the bundled clip through every
view, a head chosen, cross-attention heads switched off with the shared editor, and bad audio bytes
through the page's transcript view (st.error, no traceback; every kind is in test_speech.py)."""
from pathlib import Path

from streamlit.testing.v1 import AppTest

PAGE = str(Path(__file__).resolve().parent.parent / "pages" / "7_Speech.py")
ROW = "speech.row:whisper-tiny-en:4x6:{}"   # the head editor's row of a decoder layer (heads on)


def run_page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.run()
    assert not at.exception, at.exception
    return at


def test_bundled_clip_is_transcribed_with_every_view():
    at = run_page()
    assert at.subheader[0].value == "Hello World, this is a test on speech recognition."
    assert any("synthetic speech" in c.value for c in at.caption)
    # Only the chosen view is drawn (and computed): the spectrogram first, then each in turn.
    assert {c.key for c in at.get("plotly_chart")} == {"speech.spectrogram"}
    at.selectbox(key="speech.head").set_value("L3H1 ★").run()
    assert not at.exception, at.exception
    view(at, "Every head")
    assert {c.key for c in at.get("plotly_chart")} == {"speech.grid"}
    view(at, "Word timestamps")
    assert {c.key for c in at.get("plotly_chart")} == {"speech.words_fig"}
    words = [m.value for m in at.markdown if " s" in m.value and m.value.startswith("**")]
    assert words[0].startswith("**Hello** · 0.00") and len(words) == 9
    assert len(at.get("audio")) == 1 + 9                      # the clip, and each word from its start


def view(at, name: str) -> AppTest:
    at.radio(key="speech.view").set_value(name).run()
    assert not at.exception, at.exception
    return at


def test_switching_cross_attention_heads_off_changes_the_transcript():
    at = view(run_page(), "Switch heads off")
    for layer in (2, 3):
        at.button_group(key=ROW.format(layer)).set_value([]).run()
    at.button(key="speech.apply").click().run()
    assert not at.exception, at.exception
    off = [m.value for m in at.markdown if m.value.startswith("**With those heads off:**")]
    assert off and "Hello World, this is a test on speech recognition." not in off[0]
    assert any(m.value.startswith("Change: ") for m in at.markdown)
    assert "speech.off_grid" in {c.key for c in at.get("plotly_chart")}


def test_bad_audio_gets_a_message_not_a_traceback():
    def script():
        from attnviz.ui import speech_page
        model = speech_page.shared_model("whisper-tiny-en")
        for data in (b"this is not audio at all" * 10, b"", b"RIFF" + bytes(40)):
            speech_page.transcript(model, data)
    at = AppTest.from_function(script, default_timeout=180).run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 3 and "not audio" in errors[0] and "empty" in errors[1] and "WAV or FLAC" in errors[2]


def test_apply_runs_only_the_decoder_again_the_encoder_once_per_clip(monkeypatch):
    """Before: every Apply (and layer box) transcribed from scratch, the encoder included, though
    only decoder heads change. Counted by the encoder's runs, not timed."""
    import streamlit as st
    from attnviz.core.speech_model import SpeechModel
    runs = []
    real = SpeechModel.encode_audio

    def counted(self, *args, **kwargs):
        runs.append(1)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(SpeechModel, "encode_audio", counted)
    st.cache_resource.clear()
    at = view(run_page(), "Switch heads off")
    assert len(runs) == 1                                    # the clip's own transcription
    texts = []
    for layer in (2, 3):
        at.button_group(key=ROW.format(layer)).set_value([]).run()
        assert len(runs) == 1 + (layer == 3)                 # a head click recomputes nothing
        at.button(key="speech.apply").click().run()
        assert not at.exception, at.exception
        texts.append([m.value for m in at.markdown if m.value.startswith("**With those heads off:**")])
    assert len(runs) == 2                                    # one encoder pass kept for both masks
    assert texts[0] and texts[1]


def test_a_reused_encoder_output_gives_the_same_transcript():
    import torch
    from attnviz.weights import catalogue
    from attnviz.ui import speech_page
    model = catalogue.load_model("whisper-tiny-en")
    data = speech_page.CLIP.read_bytes()
    keep = torch.ones(model.cfg.n_dec_layers, model.cfg.n_heads)
    keep[2:] = 0
    fresh = model.transcribe(data, head_mask=keep, cut=True)
    memory = speech_page._encoded(model, model.transcribe(data, cut=True).features)
    reused = model.transcribe(data, head_mask=keep, cut=True, memory=memory)
    assert reused.text == fresh.text and torch.equal(reused.ids, fresh.ids)
    assert all(torch.equal(a, b) for a, b in zip(reused.cross_attentions, fresh.cross_attentions))
    assert [(w.start, w.end) for w in reused.words] == [(w.start, w.end) for w in fresh.words]
    import pytest
    with pytest.raises(ValueError, match="reused encoder output"):
        model.transcribe(data, cut=True, memory=memory, variant="local:64")


def test_a_layer_box_is_a_pending_edit_and_apply_transcribes_once():
    """Staged editor: a layer box changes the grid only (nothing is transcribed), Apply runs once."""
    at = view(run_page(), "Switch heads off")
    runs = at.session_state["speech.transcriptions"]
    at.checkbox(key="speech.layer:whisper-tiny-en:4x6:1").uncheck().run()
    assert not at.exception, at.exception
    assert at.session_state["speech.transcriptions"] == runs
    assert at.session_state["speech.applied:whisper-tiny-en:4x6"] == "4x6-ffffff"     # not applied yet
    assert any(c.value.startswith("**6 pending changes**") for c in at.caption)
    at.button(key="speech.apply").click().run()
    assert not at.exception, at.exception
    assert at.session_state["speech.transcriptions"] == runs + 1
    assert at.session_state["speech.applied:whisper-tiny-en:4x6"] != "4x6-ffffff"
    assert any(c.value.startswith("No pending changes") for c in at.caption)
    assert any(m.value.startswith("**With those heads off:**") for m in at.markdown)
