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
