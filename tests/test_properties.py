"""Property-based: any text through tokenise -> trace, any bytes through open_image, raise nothing
but a ValueError with a message."""
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import attnviz

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def minilm():
    return attnviz.load_model("minilm")


@FAST
@given(text=st.text(min_size=0, max_size=200))
def test_any_text_traces_or_says_why(minilm, text):
    try:
        tr = minilm.trace(text)
    except ValueError as err:
        assert str(err)
        assert not text.strip()  # only empty / whitespace text is refused at this length
        return
    assert tr.attentions.shape == (6, 12, tr.n, tr.n) and len(tr.tokens) == tr.n
    assert all(isinstance(t, str) and t for t in tr.tokens)


@FAST
@given(data=st.binary(max_size=2048))
def test_any_bytes_open_or_say_why(data):
    try:
        img = attnviz.open_image(data)
    except ValueError as err:
        assert str(err)
        return
    assert img.mode == "RGB" and img.width > 0 and img.height > 0


def _png(w, h, mode="RGB"):
    buf = io.BytesIO()
    Image.new(mode, (w, h)).save(buf, format="PNG")
    return buf.getvalue()


@FAST
@given(base=st.sampled_from([_png(8, 8), _png(3, 17, "RGBA"), _png(5, 5, "P"), _png(4, 9, "L")]),
       cut=st.integers(min_value=0, max_value=200), flips=st.lists(st.integers(0, 255), max_size=8))
def test_damaged_images_open_or_say_why(base, cut, flips):
    data = bytearray(base[: max(0, len(base) - cut)])
    for i, value in enumerate(flips):
        if data:
            data[(i * 37) % len(data)] = value
    try:
        img = attnviz.open_image(bytes(data))
    except ValueError as err:
        assert str(err)
        return
    assert img.mode == "RGB"
