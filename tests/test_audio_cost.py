"""Odd audio is bounded by what it costs: a sample rate whose resampling to 16 kHz needs a huge
filter is refused from the header with a message; size refusals say the real sizes."""
import io

import numpy as np
import pytest
import scipy.signal
import soundfile as sf

from attnviz.base.limits import sizes
from attnviz.uploads import audio


def tone(rate: int, seconds: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def wav(samples, rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, subtype="PCM_16", format="WAV")
    return buf.getvalue()


def test_a_prime_sample_rate_is_refused_before_any_resampling(monkeypatch):
    def costly(*args, **kwargs):
        raise AssertionError("resampled")
    monkeypatch.setattr(scipy.signal, "resample_poly", costly)
    with pytest.raises(ValueError, match=r"383,987 samples per second.*16,000 / 383,987.*standard rate"):
        audio.read_audio(wav(tone(383_987, 0.2), 383_987))
    with pytest.raises(ValueError, match=r"96,001 samples per second"):
        audio.read_audio(tone(96_001), rate=96_001)   # an array at an odd rate: the same check


@pytest.mark.parametrize("rate", [8_000, 11_025, 22_050, 44_056, 44_100, 47_952, 48_000, 96_000, 192_000, 384_000])
def test_standard_rates_still_resample_to_16_khz(rate):
    got = audio.read_audio(wav(tone(rate), rate))
    assert got.source_rate == rate and abs(len(got.samples) - 8_000) <= 1   # 0.5 s at 16 kHz


def test_size_refusals_say_the_real_sizes(set_limits):
    assert sizes(20 * 10**6 + 1, 20 * 10**6) == ("20.000001 MB", "20.000000 MB")
    assert sizes(25 * 10**6, 20 * 10**6) == ("25.0 MB", "20.0 MB")
    assert sizes(20_040_000, 20 * 10**6) == ("20.040 MB", "20.000 MB")
    set_limits(max_audio_bytes=10**6)
    with pytest.raises(ValueError, match=r"the file is 1\.000044 MB; the limit is 1\.000000 MB"):
        audio.read_audio(b"RIFF" + bytes(10**6 + 40))
