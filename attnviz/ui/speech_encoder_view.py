"""The Speech page's views of a speech encoder (wav2vec 2.0, HuBERT: a folder or a Hugging Face name):
the clip's frames attending to frames for one layer and head under the waveform, every head at once,
and heads switched off with the shared head editor (how far each frame's output moves; a CTC model's
letters with and without them). The speech page calls `body` when the picked model is one."""
from __future__ import annotations

import hashlib

import streamlit as st
import torch

from attnviz.base import memory, names
from attnviz.base.limits import LIMITS
from attnviz.core.audio_frames import frame_count
from attnviz.figures import speech_figures
from attnviz.ui import shared_view
from attnviz.ui.common import plain, view_choice
from attnviz.ui.head_editor import head_editor, mask_key
from attnviz.uploads.audio import RATE, read_audio

PAGE = "speech"
MAX_SECONDS = 30        # the clip is cut to this at most: 1,500 frames of 20 ms, as Whisper's window
VIEWS = ("Attention over frames", "Every head", "Switch heads off")


def key(name: str) -> str:
    return names.session_key(PAGE, "encoder_" + name)


def longest_seconds(model) -> float:
    """The clip is cut to what the capture budget holds: every layer's and head's frames x frames
    (a 12 x 12 base model's 512 MB hold 965 frames, 19.3 s), at most MAX_SECONDS."""
    c = model.cfg
    frames = memory.longest_fitting(int(LIMITS.max_capture_mb * memory.MB), c.n_layers, c.n_heads)
    return min(float(MAX_SECONDS), frames * c.hop / RATE)


@st.cache_resource(max_entries=8, show_spinner=False)
def _traced(model_key: str, digest: str, mask_id: bytes, _model, _data: bytes, _mask):
    # cache_resource: one trace per clip and mask, shared by every session and never changed
    audio = read_audio(_data, cut=True, max_seconds=longest_seconds(_model))
    c = _model.cfg
    memory.plan_capture("this clip's encoder attention", layers=c.n_layers, heads=c.n_heads,
                        n=frame_count(c, len(audio.samples)), shorten="the audio")
    return audio, _model.trace(audio, head_mask=_mask)


def traced(model, data: bytes, mask=None):
    """(audio, trace), or None after showing the error."""
    try:
        with st.spinner("Encoding the clip…"):
            return _traced(model.info.key, hashlib.sha256(data).hexdigest(), mask_key(mask), model, data, mask)
    except ValueError as err:
        st.error(plain(str(err)))
        return None


def letters(model, tr) -> str | None:
    """A CTC model's greedy reading (the most likely symbol per frame, through the folder's own
    tokenizer, which merges repeats and drops blanks); None without a CTC head or tokenizer."""
    if tr.logits is None or model.tokenizer is None:
        return None
    return model.tokenizer.decode(tr.logits.argmax(-1).tolist())


def explain(model, tr):
    c = model.cfg
    with st.expander("Where Q, K and V come from", expanded=False):
        st.markdown(
            f"A speech encoder ({c.family}) reads the **raw samples**: {len(c.conv_layers)} convolutions turn "
            f"them into **frames of {tr.seconds_per_token * 1000:g} ms**, a linear layer widens each frame to "
            f"{c.d_model} numbers, and a wide convolution over {c.pos_conv_kernel} neighbouring frames adds "
            "what the model knows of **position** (there is no position table). Then "
            f"{c.n_layers} layers of self-attention, {c.n_heads} heads each: in every head each frame is a "
            "**query** and every frame of the clip a **key and value**, so row *t* of a map says which "
            "moments of the sound frame *t* read. There is no text and no decoder: the model's output is "
            "one vector per frame" + (" and, with its CTC head, a letter (or blank) per frame." if c.ctc_head
                                       else "."))


def summary(model, audio, tr):
    c1, c2, c3 = st.columns(3)
    c1.metric("frames", f"{tr.n:,}")
    c2.metric("audio", f"{audio.duration:.2f} s")
    c3.metric("source", f"{audio.source_rate / 1000:g} kHz · {audio.channels} ch")
    st.audio(audio.samples, sample_rate=RATE)
    if audio.truncated_seconds:
        st.warning(f"The audio is {audio.seconds:.1f} s long; only its first {audio.duration:.1f} s are encoded "
                   f"({audio.truncated_seconds:.1f} s left out): every head's frames × frames map of a longer "
                   f"clip would exceed this server's capture budget ({LIMITS.max_capture_mb} MB).")
    text = letters(model, tr)
    if text is not None:
        st.markdown("**CTC reading:** " + (plain(text) or "(blank)"))


def head_options(model) -> list[str]:
    c = model.cfg
    return [names.head_name(l, h) for l in range(c.n_layers) for h in range(c.n_heads)]


def attention(model, audio, tr):
    choice = st.selectbox("Self-attention of", **shared_view.linked(key("head"), options=head_options(model)))
    layer, head = names.parse_head_name(choice)
    st.plotly_chart(speech_figures.frames_figure(audio.samples, RATE, tr.attentions[layer, head],
                                                 tr.seconds_per_token, f"{choice} · frames × frames"),
                    key=key("frames"))
    st.caption("Row t: the frames that frame t read in this head (each row sums to 1). A bright diagonal "
               "reads the frame itself or its neighbours; a column lit all the way down is a moment every "
               "frame reads (often a silence or the clip's start).")


def every_head(model, tr, off=None):
    st.plotly_chart(speech_figures.heads_grid(tr.attentions, tr.n, off=off, rows="frames",
                                              frame_seconds=tr.seconds_per_token),
                    key=key("grid" if off is None else "off_grid"))
    st.caption("Every layer and head, frames × frames over the clip, each scaled to its own largest weight.")


def heads_off(model, data: bytes, audio, tr):
    """Switch heads off with the shared editor; encode again beside it."""
    st.caption("A head switched off adds nothing to its layer's output (zero ablation, as pruning it "
               "would); the maps of what it would read stay on view.")

    def effect(keep):
        if bool(keep.all()):
            st.info("Switch heads off in the grid, then Apply: the clip is encoded again without them.")
            return None
        got = traced(model, data, keep.float())
        if got is None:
            return None
        masked = got[1]
        change = 1 - torch.nn.functional.cosine_similarity(masked.hidden, tr.hidden, dim=-1)

        def draw():
            st.plotly_chart(speech_figures.change_figure(change, tr.seconds_per_token), key=key("change"))
            text = letters(model, masked)
            if text is not None:
                st.markdown("**CTC reading with those heads off:** " + (plain(text) or "(blank)"))
            every_head(model, masked, off=(keep == 0).tolist())
        return draw

    head_editor(model.cfg, PAGE, None, model_key=model.info.key, effect=effect, link=True)


def body(model, data: bytes, drawn_before: bool):
    """The encoder's part of the page: what it is, the clip, then the chosen view."""
    got = traced(model, data)
    if got is None:
        return
    audio, tr = got
    explain(model, tr)
    summary(model, audio, tr)
    view = names.session_key(PAGE, "view")   # the page's one view radio (see speech_page.views)
    if not drawn_before and st.session_state.get(view) in VIEWS:
        st.session_state[view] = st.session_state[view]
    chosen = view_choice(PAGE, list(VIEWS))
    if chosen == VIEWS[0]:
        attention(model, audio, tr)
    elif chosen == VIEWS[1]:
        every_head(model, tr)
    else:
        heads_off(model, data, audio, tr)
    st.session_state[names.session_key(PAGE, "view_drawn")] = True
