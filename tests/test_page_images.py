"""AppTest of pages/3_Images.py with the bundled DINOv2: sample photos, uploads good and bad,
head toggling. Pixel exactness of the maps is tested in test_vision.py."""
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from streamlit.testing.v1 import AppTest

from attnviz.ui.common import plain

from tests.test_image_uploads import padded_png, png_header_only
from tests.test_parity import tiny

PAGE = str(Path(__file__).resolve().parent.parent / "pages" / "3_Images.py")
VIEWS = ("CLS → patches", "Patch query", "Rollout & saliency", "Artefact tokens", "Attention distance",
         "Head-mask effect", "Export")


def row_key(layer: int) -> str:
    """The head editor's row of this layer (the heads that are on) for the bundled DINOv2."""
    return f"images.row:dinov2:12x6:{layer}"


def show(at, view) -> AppTest:
    """Choose the view beside the head editor (only the chosen one is computed)."""
    at.button_group(key="images.view_choice").set_value(view).run()
    assert not at.exception, at.exception
    return at


def png(width=90, height=60) -> bytes:
    buffer = io.BytesIO()
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[:, width // 2:] = (250, 200, 0)
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def run_page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=180).run()
    assert not at.exception, at.exception
    return at


def photo_caption(at) -> str:
    return next(c.value for c in at.caption if "resized to" in c.value)


def image_captions(at) -> list[str]:
    return [text for image in at.get("image") for text in image.captions]


def test_sample_photo_shows_every_view():
    at = run_page()
    assert not at.error
    assert at.sidebar.selectbox(key="model_choice:vision").value == "dinov2"
    assert "**cat**" in photo_caption(at) and "16×16 patches of 14 px · 257 tokens" in photo_caption(at)
    assert at.button_group(key="images.view_choice").value == VIEWS[0]   # the default view
    captions = image_captions(at)
    assert any("Attention from CLS" in c for c in captions)
    assert not at.get("plotly_chart") and not at.main.get("download_button")  # other views: not computed
    captions = image_captions(show(at, "Patch query"))
    assert any("Where patch (8, 8)" in c for c in captions)          # centre patch by default
    assert not any("Attention from CLS" in c for c in captions)
    captions = image_captions(show(at, "Rollout & saliency"))
    assert any("rollout" in c for c in captions) and any("saliency output" in c for c in captions)
    captions = image_captions(show(at, "Artefact tokens"))
    assert any("flagged patches outlined" in c for c in captions)
    assert any("patches flagged" in m.value for m in at.markdown)
    assert len(show(at, "Attention distance").get("plotly_chart")) == 1   # distance vs depth
    assert [b.key for b in show(at, "Export").main.get("download_button")] == [
        "images.png_view", "images.png", "images.npz"]
    assert "All heads are on" in show(at, "Head-mask effect").info[0].value
    assert at.button_group(key="images.view_choice").value == "Head-mask effect"   # remembered
    show(at, "CLS → patches")

    size = at.sidebar.select_slider(key="images.size")
    assert size.options[0].startswith("112 px · 65 tokens") and size.options[-1].startswith("448 px")
    at.main.selectbox(key="images.sample").set_value("coffee")
    size.set_value(112)
    at.radio(key="images.view").set_value("Every layer × head")
    at.run()
    assert not at.exception and not at.error
    assert "**coffee**" in photo_caption(at) and "8×8 patches" in photo_caption(at)
    assert show(at, "Patch query").number_input(key="images.row").value == 7   # clamped into the 8 x 8 grid


def test_uploads_good_and_bad_keep_the_page_working():
    at = run_page()
    at.main.radio(key="images.source").set_value("Upload").run()
    uploader = at.main.file_uploader(key="images.upload")
    assert set(uploader.allowed_type) >= {".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tiff"}
    assert "**cat**" in photo_caption(at)                            # nothing uploaded yet

    uploader.set_value(("stripes.png", png(), "image/png"))
    at.run()
    assert not at.exception and not at.error
    assert "**stripes\\.png** · 90×60 px" in photo_caption(at)  # the name escaped: shown as typed

    bad = [("empty.png", b"", "empty"),
           ("bomb.png", png_header_only(60_000, 60_000), "pixels"),
           ("notes.png", b"just some text, not a picture\n" * 20, "not an image"),
           ("cut.png", png()[:120], "truncated")]
    for name, data, reason in bad:
        at.main.file_uploader(key="images.upload").set_value((name, data, "image/png"))
        at.run()
        assert not at.exception, name
        shown = plain(name)  # the file name is escaped: markdown shows it as typed
        assert len(at.error) == 1 and shown in at.error[0].value and reason in at.error[0].value
        assert "**stripes\\.png**" in photo_caption(at), name          # the last good photo stays
        assert any("Attention from CLS" in c for c in image_captions(at))


def test_switching_heads_off_shows_the_effect():
    layer, head = 0, 3
    at = run_page()
    at.button_group(key=row_key(layer)).unselect(head).run()       # an edit: nothing runs yet
    assert not at.exception and "heads off" not in photo_caption(at)
    at.button(key="images.apply").click().run()
    show(at, "Head-mask effect")
    assert "1 heads off" in photo_caption(at)
    metrics = {m.label: float(m.value) for m in at.metric}
    assert set(metrics) == {"CLS embedding cosine", "Saliency IoU at 0.5", "Saliency mean |change|"}
    assert 0 < metrics["CLS embedding cosine"] < 1
    said = next(i.value for i in at.info if i.value.startswith("With 1 of "))   # the answer, said
    assert f"the CLS embedding keeps cosine {metrics['CLS embedding cosine']:.4f}" in said
    assert f"overlaps the full model's at IoU {metrics['Saliency IoU at 0.5']:.3f}" in said
    assert 0 <= metrics["Saliency IoU at 0.5"] <= 1 and metrics["Saliency mean |change|"] > 0
    captions = image_captions(at)
    assert "Saliency, 1 heads off" in captions and "Rollout, heads off" in captions

    at.button(key="images.reset").click().run()
    assert not at.exception and "1 heads off" in photo_caption(at)     # Reset waits for Apply too
    at.button(key="images.apply").click().run()
    assert not at.exception and "heads off" not in photo_caption(at)
    assert "All heads are on" in at.info[0].value and not at.metric


def test_a_local_vit_folder_works_too(tmp_path, monkeypatch, set_limits):
    import dataclasses

    from attnviz.ui import common
    # The app offers local folders only inside a deployment's allow-list.
    set_limits(allowed_model_dirs=str(tmp_path))
    tiny("vit").save_pretrained(tmp_path)                  # patch 8, 2 layers x 4 heads, no decoder
    at = AppTest.from_file(PAGE, default_timeout=180)
    at.session_state["model_choice:vision"] = "local folder…"
    at.session_state["model_custom_dir"] = str(tmp_path)
    at.run()
    assert not at.exception, at.exception
    assert not at.error
    size = at.sidebar.select_slider(key="images.size")
    assert size.value == 112 and size.options[1].startswith("120 px")   # multiples of 8
    assert "14×14 patches of 8 px · 197 tokens" in photo_caption(at)
    assert any("no saliency decoder" in i.value for i in show(at, "Rollout & saliency").info)


def gif(width=1, height=1) -> bytes:
    buffer = io.BytesIO()
    Image.new("P", (width, height)).save(buffer, "GIF")
    return buffer.getvalue()


def upload(at, name, data, kind="image/png") -> AppTest:
    at.main.file_uploader(key="images.upload").set_value((name, data, kind))
    at.run()
    assert not at.exception, (name, at.exception)
    return at


def upload_page() -> AppTest:
    at = run_page()
    at.main.radio(key="images.source").set_value("Upload").run()
    return at


def test_a_1x1_gif_gets_a_message_and_never_becomes_the_fallback():
    at = upload_page()
    upload(at, "dot.gif", gif(), "image/gif")                # the crash: x1 < x0
    assert len(at.error) == 1 and "smaller than one 14×14" in at.error[0].value
    assert "**cat**" in photo_caption(at)                    # the first sample stands in
    upload(at, "notes.png", b"just some text, not a picture\n" * 20)
    assert len(at.error) == 1 and "not an image" in at.error[0].value
    assert "**cat**" in photo_caption(at)                    # not the GIF: the page still works
    assert any("Attention from CLS" in c for c in image_captions(at))

    upload(at, "stripes.png", png())
    upload(at, "dot.gif", gif(), "image/gif")
    upload(at, "cut.png", png()[:120])
    assert len(at.error) == 1 and "truncated" in at.error[0].value
    assert "**stripes\\.png**" in photo_caption(at)          # the last photo that worked


@pytest.mark.parametrize("size", [(1, 640), (40, 900), (900, 40)])
def test_strips_beyond_20_to_1_get_a_message(size):
    # (1, 640): the 75-byte PNG that took the server from 2.2 to 4.5 GB, then crashed.
    at = upload_page()
    upload(at, "stripes.png", png())
    upload(at, "strip.png", png(*size))
    assert len(at.error) == 1 and plain("limit is 20:1") in at.error[0].value
    assert "**stripes\\.png**" in photo_caption(at)


def test_upload_cap_is_stated_and_exact():
    at = upload_page()
    assert "Up to 20 MB (20,000,000 bytes) per file" in at.main.file_uploader(key="images.upload").help
    upload(at, "big.png", padded_png(20_000_000))
    assert not at.error and "**big\\.png** · 32×24 px" in photo_caption(at)
    upload(at, "bigger.png", padded_png(20_000_001))
    assert len(at.error) == 1
    assert plain("20,000,001 bytes, over the limit of 20,000,000 bytes (20 MB)") in at.error[0].value
    assert "**big\\.png**" in photo_caption(at)


EVIL = "[click](http:evil.example) **bold**.png"


def markdown_bodies(at) -> list[str]:
    """The markdown source of every element that renders it (errors, captions, text, info)."""
    kinds = ("error", "caption", "markdown", "info", "warning", "success", "title", "subheader")
    return [element.value for kind in kinds for element in at.get(kind)] + image_captions(at)


def assert_no_markup_from(at, name=EVIL):
    bodies = [body for body in markdown_bodies(at) if "click" in body or "bold" in body]
    assert bodies, "the file name is shown somewhere"
    for body in bodies:
        assert plain(name) in body, body                     # every character escaped
        assert "[click](" not in body and "**bold**" not in body, body


def test_upload_names_never_render_as_markdown():
    at = upload_page()
    upload(at, EVIL, png())
    assert not at.error
    assert_no_markup_from(at)                                # the photo caption
    upload(at, EVIL, b"just some text, not a picture\n" * 20)
    assert len(at.error) == 1
    assert_no_markup_from(at)                                # the error and "Showing ... until"


def test_a_file_that_fails_to_decode_is_not_decoded_again_on_every_rerun(monkeypatch):
    """Exceptions are not cached, so a bad file was decoded again on every slider nudge
    (a 20 MB RLE8 BMP: 8 s of CPU each time). The failure is remembered by content digest."""
    from attnviz.uploads import images
    calls, real = [], images.open_image

    def counting(data, *args, **kwargs):
        calls.append(len(data))
        return real(data, *args, **kwargs)
    monkeypatch.setattr(images, "open_image", counting)
    at = upload_page()
    upload(at, "stripes.png", png())
    bad = png()[:120]
    upload(at, "cut.png", bad)
    assert len(at.error) == 1 and "truncated" in at.error[0].value
    decodes = calls.count(len(bad))
    assert decodes == 1
    for opacity in (0.3, 0.8):                                   # slider nudges: rerun, no decode
        at.sidebar.slider(key="images.alpha").set_value(opacity).run()
        assert not at.exception
        assert len(at.error) == 1 and "truncated" in at.error[0].value   # still said
        assert "**stripes\\.png**" in photo_caption(at)                   # the last good photo stays
    show(at, "Patch query")
    assert calls.count(len(bad)) == decodes


# ---------------------------------------------------------------- crop, pad or squeeze
def test_non_square_photo_is_centre_cropped_by_default_and_can_be_padded_or_squeezed():
    at = upload(upload_page(), "stripes.png", png())
    assert at.sidebar.radio(key="images.fit").value == "crop"
    assert "90×60 px, centre square cropped, resized to 224×224" in photo_caption(at)
    at.sidebar.radio(key="images.fit").set_value("pad").run()
    assert not at.exception
    assert "padded to a square with the mean colour, resized to 224×224" in photo_caption(at)
    at.sidebar.radio(key="images.fit").set_value("squeeze").run()
    assert "90×60 px, squeezed, resized to" in photo_caption(at)
    at.main.radio(key="images.source").set_value("Sample photo").run()   # a square sample: nothing said
    assert "cropped" not in photo_caption(at) and "padded" not in photo_caption(at)


# ---------------------------------------------------------------- say the scale, draw a colour bar
def test_overlays_say_their_scale_offer_a_shared_one_and_draw_a_colour_bar():
    at = run_page()
    assert at.radio(key="images.scale").value == "own range"
    captions = image_captions(at)
    assert any("each tile scaled to its own range" in c for c in captions)
    assert len(at.get("image")) == 2                         # the overlays and their colour bar
    at.radio(key="images.scale").set_value("one scale for all tiles").run()
    assert not at.exception
    assert any("all tiles on one colour scale" in c for c in image_captions(at))
    show(at, "Patch query")
    assert any("all tiles on one colour scale" in c for c in image_captions(at)) and len(at.get("image")) == 2
    captions = image_captions(show(at, "Rollout & saliency"))
    assert any("rollout" in c and "scaled to its own range" in c for c in captions)
    assert any("saliency output (0…1)" in c for c in captions)              # a fixed scale, said


def test_shared_scale_keeps_a_weak_head_dark():
    from attnviz.figures import image_figures
    weak = np.zeros((4, 4), np.float32)
    weak[0, 0] = 0.1
    maps = torch.from_numpy(np.stack([weak, 10 * weak]))[None]          # (1, 2, 4, 4): same pattern
    photo = Image.new("RGB", (64, 64), (128, 128, 128))
    own = np.asarray(image_figures.head_overlays(photo, maps, [0], tile=64, alpha=1.0))
    shared = np.asarray(image_figures.head_overlays(photo, maps, [0], tile=64, alpha=1.0, shared=True))
    left, right = slice(0, 64), slice(68, 132)                          # tiles 64 px, gap 4
    body = slice(18, 82)                                                # below the label strip
    assert np.array_equal(own[body, left], own[body, right])            # own range: look the same
    assert shared[body, left][:16, :16].mean() < shared[body, right][:16, :16].mean()   # weak: darker
    assert image_figures.map_range(maps) == (0.0, pytest.approx(1.0))
    bar = image_figures.colour_bar("0", "1", width=100)
    assert bar.size[0] == 100
