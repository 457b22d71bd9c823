"""The Lab's image reader: text attending to an image. A small encoder-decoder TRAINED HERE (never
a pretrained model) reads a digit string off a picture; each generated token's cross-attention
(text queries over image patches) is drawn on the picture, per head and averaged, with the heads
switchable in the one head editor (`attnviz.toys.image_reader`, `attnviz.figures.reading_figures`)."""
from __future__ import annotations

import time
import uuid

import pandas as pd
import streamlit as st
import torch

from attnviz.base import names
from attnviz.base.limits import LIMITS
from attnviz.figures import reading_figures
from attnviz.toys import image_reader, reader_training
from attnviz.ui import job_controls
from attnviz.ui.common import plain
from attnviz.ui.head_editor import head_editor
from attnviz.ui import shared_view

PAGE = "lab"
EDITOR = "lab_reader"       # the head editor's own namespace: its mask is this view's only
SAMPLES = ("90417", "2026", "385", "7", "11235")
LABEL = "Trained here in the Lab"
VIEW = "Text reads an image"   # its name among the Lab's views
NOW, SHIPPED = "trained now, in this session", "trained here earlier (shipped with the app)"


@st.cache_resource(max_entries=1, show_spinner=False)
def shipped():
    """The reader trained here earlier by `python -m attnviz.toys.reader_training` (safetensors)."""
    return reader_training.load()


def key(name: str) -> str:
    return names.session_key(PAGE, f"reader_{name}")


def open_in_lab():
    """The Images page's way here: the Lab, opened on this view."""
    st.session_state[names.session_key(PAGE, "view")] = VIEW
    try:
        st.switch_page("pages/5_Lab.py")
    except st.errors.StreamlitAPIException:  # a page run on its own (no app around it)
        st.info("Open the Lab page and choose its view 'Text reads an image'.")


def train_form():
    """Train a reader now; returns (result, key) of the last one trained in this session, or (None, None)."""
    ss = st.session_state
    with st.form(key("form")):
        c1, c2, c3 = st.columns(3)
        steps = c1.number_input("Steps", value=1500, step=100, **shared_view.linked(key("steps"), bounds=(20, 3000)))
        width = c2.select_slider("Width d_model", value=32, **shared_view.linked(key("width"), options=[16, 32, 48]))
        seed = c3.number_input("Seed", value=0, step=1, **shared_view.linked(key("seed"), bounds=(0, 999)))
        go = st.form_submit_button("Train", key=key("train"))
    try:
        settings = reader_training.ReaderSettings(steps=int(steps), d_model=int(width), seed=int(seed))
        if go:
            settings.check()
            with st.spinner("Timing a few training steps on this machine…"):
                guess = reader_training.timed_estimate(settings)
            if guess > settings.budget_s:  # timed here: a busy machine is refused before, not cut after
                fit = max(1, int(settings.steps * settings.budget_s / guess))
                raise ValueError(f"timed on this machine now, {settings.steps} steps would take about {guess:.0f} s, "
                                 f"over the {settings.budget_s:.0f} s budget: use at most {fit} steps")
            started, live = time.perf_counter(), st.empty()
            with live.container():
                bar = st.progress(0.0, f"training… about {guess:.0f} s (timed here); leaving the page or "
                                       "pressing Stop cancels it")

            def report(step, total, loss):
                if step % 25 == 0 or step == total:  # redrawing every step would cost more than training
                    left = (time.perf_counter() - started) / step * (total - step)
                    bar.progress(step / total, f"step {step}/{total}, loss {loss:.3f} · about {left:.0f} s left")

            try:  # a heavy-job slot (ServerBusy at once if none is free), stopped when the session goes
                with job_controls.heavy_job("an image-reader training") as cancel:
                    res = reader_training.train(settings, report, should_stop=cancel)
            finally:
                live.empty()
            ss[key("trained")] = (res, f"reader:{uuid.uuid4().hex}")
            ss[key("which")] = NOW         # the radio below is drawn after this: read the new one
    except ValueError as err:
        st.error(plain(str(err)))
    return ss.get(key("trained"), (None, None))


def sentence(reading, step: int, layer: int, keep: torch.Tensor) -> str:
    """What the numbers say about one generated token, read from them."""
    tok = reading.tokens[step]
    if tok not in image_reader.DIGITS or step >= len(reading.drawn.text):
        return (f"Step {step} ends the reading (`{tok}`): there is no digit left for it to look at; "
                f"its mean attention in layer {layer} is spread as drawn.")
    shares = [reading.share_on_digit(step, layer, h) for h in range(reading.cross.shape[1])]
    on = [h for h in range(len(shares)) if keep[layer, h] > 0] or list(range(len(shares)))
    best = max(on, key=lambda h: shares[h])
    meant = reading.drawn.text[step]
    return (f"Token '{tok}' puts {shares[best]:.2f} of head {best}'s attention (layer {layer}) on the patches "
            f"of the picture's digit {step + 1}, a '{meant}'; the heads' mean puts "
            f"{reading.share_on_digit(step, layer):.2f} there ({len(reading.drawn.patch_columns(step))} of "
            f"{image_reader.GRID[1]} patch columns).")


def reader_view(_model=None):
    """The view (the Lab passes its picked model; this view has its own)."""
    st.markdown(
        f"**{LABEL}, not a pretrained model.** No package that installs here ships the weights of an "
        "OCR or captioning decoder with cross-attention (they download from a hub at run time), so this "
        "small encoder-decoder was trained from scratch here to read a digit string off a picture drawn "
        "with Pillow (left-aligned, its start, spacing and height jittered by a few pixels). The image encoder cuts the 16 × 64 picture into "
        f"{image_reader.GRID[0]} × {image_reader.GRID[1]} patches of {image_reader.PATCH} × "
        f"{image_reader.PATCH} pixels (patch embedding, learned row and column positions, self-attention); "
        "the text decoder's cross-attention takes its **queries from the text tokens** and its **keys and "
        "values from the image patches**, each through its own projection. Row t of a map says which "
        "patches the decoder read while choosing token t.")
    res, reader_key = train_form()
    if res is None or st.radio("Reader", [NOW, SHIPPED], key=key("which"), horizontal=True) == SHIPPED:
        res, reader_key = shipped(), reader_training.KEY
        st.info(f"{LABEL} earlier, not a pretrained model: this reader was trained by `python -m "
                f"attnviz.toys.reader_training` ({res.steps_done:,} steps, {res.seconds:.0f} s on this machine) "
                "and ships with the app as safetensors. Press Train (at most "
                f"{LIMITS.max_train_seconds:.0f} s) to train your own now.")
    else:
        (st.warning if res.stopped_early else st.success)(
            f"{LABEL}: {res.steps_done} steps in {res.seconds:.1f} s"
            + (" — stopped early (time budget or cancelled)." if res.stopped_early else "."))
    c1, c2 = st.columns(2)
    c1.metric("Held-out pictures read exactly", f"{res.exact:.1%}")
    c2.metric("Held-out pictures", f"{len(image_reader.held_out_set()):,}",
              help="strings never drawn for training (CRC-32 a multiple of 5), every digit and the end right")
    c1, c2 = st.columns([2, 1])
    sample = c2.selectbox("Sample", **shared_view.linked(key("sample"), options=SAMPLES))
    text = c1.text_input(f"Digits to draw ({image_reader.MIN_DIGITS}-{image_reader.MAX_DIGITS})", sample,
                         **shared_view.linked(key(f"text_{sample}"), kind=str))
    try:
        drawn = image_reader.draw(text)
    except ValueError as err:
        st.error(plain(str(err)))
        return
    cfg = res.net.cfg.block_config("decoder")
    st.markdown("**Cross-attention heads** (switched off heads read nothing from the picture):")
    keep = head_editor(cfg, EDITOR, model_key=reader_key)
    reading = image_reader.read(res.net, drawn, head_mask=keep)
    verdict = "read exactly" if reading.correct else f"misread (the picture says {drawn.text!r})"
    st.markdown(f"The reader reads **{reading.text or '(nothing)'}**: {verdict}.")
    c1, c2 = st.columns(2)
    labels = [f"{t}: '{tok}'" for t, tok in enumerate(reading.tokens)]
    step = c1.radio("Generated token", range(len(labels)), format_func=lambda t: labels[t], horizontal=True,
                    key=key("step"))
    layer = c2.radio("Decoder layer", range(cfg.n_layers), index=cfg.n_layers - 1, horizontal=True,
                     key=key("layer"))
    step = min(step, len(labels) - 1)
    st.markdown(plain(sentence(reading, step, layer, keep)))
    off = [h for h in range(cfg.n_heads) if keep[layer, h] == 0]
    st.image(reading_figures.token_overlays(reading, step, layer, off=off),
             caption="Bright = more attention; each map scaled to its own maximum.")
    st.markdown("**Every generated token** (heads' mean, this layer):")
    st.image(reading_figures.reading_strip(reading, layer))
    st.dataframe(pd.DataFrame({"token": reading.tokens,
                               "log p": [round(p, 3) for p in reading.logprobs],
                               **{f"share on its digit, H{h}": [
                                   round(reading.share_on_digit(t, layer, h), 2) if t < len(drawn.text) else None
                                   for t in range(len(reading.tokens))] for h in range(cfg.n_heads)}}),
                 hide_index=True, key=key("table"))
