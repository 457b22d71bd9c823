"""Speech, second pass: the last word ends where its sound ends (the alignment heads put it
0.1-0.3 s early in every clip), and the spectrogram is drawn in floored dB with colour bars."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile

from attnviz.core import speech_model
from attnviz.figures import speech_figures
from attnviz.weights.catalogue import load_model

CLIP = Path(__file__).resolve().parents[1] / "attnviz" / "data" / "audio" / "hello_world.wav"


@pytest.fixture(scope="module")
def whisper():
    return load_model("whisper-tiny-en")


def test_the_last_word_ends_where_the_speech_ends(whisper, tmp_path):
    x, rate = soundfile.read(CLIP, dtype="float32")
    padded = tmp_path / "padded.wav"                       # a second of silence after the speech
    soundfile.write(padded, np.concatenate([x, np.zeros(rate, np.float32)]), rate)
    # the known end: the last sample louder than 3% of the peak (eSpeak writes silence after the words)
    sound_end = (np.nonzero(np.abs(x) > 0.03 * np.abs(x).max())[0][-1] + 1) / rate
    for data in (CLIP.read_bytes(), padded.read_bytes()):
        words = whisper.transcribe(data).words
        assert words[-1].text.strip().startswith("recognition")
        assert abs(words[-1].end - sound_end) <= 0.05, (words[-1].end, sound_end)
        assert all(a.start <= a.end for a in words)


def test_the_last_word_is_never_moved_earlier_nor_past_the_extra():
    w = [speech_model.Word(" a", 0.0, 0.5, 1.0, [0])]
    loud = np.zeros(16_000 * 3, np.float32)
    loud[:16_000 * 2] = 0.5                                # sound until 2 s
    assert speech_model.last_word_to_silence(w, loud)[-1].end == pytest.approx(0.5 + speech_model.LAST_WORD_EXTRA)
    w = [speech_model.Word(" a", 0.0, 2.5, 1.0, [0])]
    assert speech_model.last_word_to_silence(w, loud)[-1].end == 2.5


def test_the_spectrogram_is_db_below_the_peak_floored_80_db_down_in_a_dark_readable_scale():
    feats = np.full((80, 200), -0.5, np.float32)          # digital silence sits at Whisper's clamp
    feats[:, 50:100] = 1.5                                 # 2 units = 80 dB above it
    feats[:10, 60:70] = 1.0                                # 20 dB under the peak
    fig = speech_figures.spectrogram_and_attention(feats, np.random.rand(3, 100), ["a", "b", "c"], 100)
    mel, att = fig.data[0], fig.data[1]
    z = np.asarray(mel.z, dtype=float)
    assert z.max() == 0.0 and z.min() == -80.0 and (mel.zmin, mel.zmax) == (-80.0, 0.0)
    assert z[0, 65] == -20.0 and z[0, 10] == -80.0
    assert mel.showscale is not False and "dB" in mel.colorbar.title.text
    assert list(mel.colorbar.tickvals) == [0, -20, -40, -60, -80]
    assert att.showscale is not False and att.colorbar.title.text == "weight"
    low, high = mel.colorscale[0][1], mel.colorscale[-1][1]
    # rgb(), never #000001..#000010 (Streamlit's theme swaps those for its palette): dark floor, light peak
    assert low == "rgb(0, 0, 4)" and sum(map(int, high[4:-1].split(","))) > 600
    # silence: 150 of the 200 frames (10 ms each) are at the floor
    assert speech_figures.silent_seconds(speech_figures.mel_db(feats)) == pytest.approx(1.5)
    assert speech_figures.silent_seconds(speech_figures.mel_db(feats[:, 50:100])) == 0.0
