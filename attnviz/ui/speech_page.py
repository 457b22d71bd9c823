"""The Speech page's views: Whisper tiny.en hearing a clip (bundled, uploaded or recorded), the
log-mel spectrogram with cross-attention tokens x time under it, every head, word timestamps
from the alignment heads (each word playable from its start), and heads switched off with the
shared head editor; or a speech encoder (wav2vec 2.0, HuBERT) picked by folder or name, its frames
attending to frames (`speech_encoder_view`). The page itself is a title plus calls to these functions."""
from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import streamlit as st
import torch

from attnviz.analysis import head_ablation
from attnviz.base import memory, names
from attnviz.base.limits import LIMITS, sizes
from attnviz.figures import speech_figures
from attnviz.ui.common import cached_result, model_picker, plain, shared_cache, shared_model, sidebar_nav, view_choice
from attnviz.ui.head_editor import ablation_choice, head_editor, mask_key
from attnviz.ui import shared_view, speech_encoder_view
from attnviz.ui.heads_corpus import page_tool
from attnviz.ui.translate_page import diff_markdown

PAGE = "speech"
MODEL = "whisper-tiny-en"
CLIP = Path(__file__).resolve().parent.parent / "data" / "audio" / "hello_world.wav"
SOURCES = ("Bundled clip", "Upload WAV / FLAC", "Record")
KINDS = ("Whisper tiny.en (transcribes)", "Speech encoder (wav2vec2, HuBERT)")
ENCODER_TASKS = ("audio",)     # the model picker's models for the encoder: folders and Hub names
ALIGNMENT = "alignment heads (average)"
MAX_PLAYERS = 40   # words with their own player; the rest are listed


def key(name: str) -> str:
    return names.session_key(PAGE, name)


# ---------------------------------------------------------------- inputs
def inputs():
    """Sidebar source and the audio -> (model, audio bytes), or None after showing why."""
    sidebar_nav()
    with st.sidebar:
        kind = st.radio("Model", **shared_view.linked(key("kind"), options=KINDS),
                        help="Whisper writes the text and shows where each token listened; a speech encoder "
                             "(a wav2vec2 or HuBERT folder or Hugging Face name) shows its frames attending to frames.")
        source = st.radio("Audio", **shared_view.linked(key("source"), options=SOURCES))
        st.caption(f"Limits: {LIMITS.max_audio_bytes / 1e6:.0f} MB per file, {LIMITS.max_audio_seconds:.0f} s "
                   "(Whisper hears 30 s at a time: a longer file is cut to its first 30 s), "
                   f"{LIMITS.max_transcribe_seconds:g} s per transcription.")
    data = None
    if source == SOURCES[0]:
        st.caption("The bundled clip is **synthetic speech** made with eSpeak NG (\"Hello world, this is a "
                   "test of speech recognition.\"), not a recording; tiny.en mishears one word of it.")
        data = CLIP.read_bytes()
    elif source == SOURCES[1]:
        up = st.file_uploader("A WAV or FLAC file", type=["wav", "flac"], key=key("upload"))
        if up is None:
            st.info("Upload a WAV or FLAC recording of speech (any sample rate; stereo is mixed down).")
            return None
        if up.size > LIMITS.max_audio_bytes:
            size, limit = sizes(up.size, LIMITS.max_audio_bytes)
            st.error(f"The file is {size}; the limit is {limit}. Upload a shorter recording.")
            return None
        data = up.getvalue()
    else:
        rec = st.audio_input("Record a sentence", key=key("record"))
        if rec is None:
            st.info("Press the microphone, say a sentence in English, press stop.")
            return None
        data = rec.getvalue()
    if kind == KINDS[1]:
        model = model_picker(tasks=ENCODER_TASKS, nav=False)
        return None if model is None else (model, data)
    try:
        with st.spinner(f"Loading {MODEL}…"):
            model = shared_model(MODEL)
    except ValueError as err:
        st.error(plain(str(err)))
        return None
    return model, data


@st.cache_resource(max_entries=8, show_spinner=False)
def _transcribed(model_key: str, digest: str, mask_id: bytes, _model, _data: bytes, _mask, _fill=None,
                 _on_run=None):
    # cache_resource: one transcript per audio, mask and fill (mask_id holds both), shared, never changed;
    # `_on_run` is told of every transcription that runs (a miss), not of what the cache gives back
    if _on_run is not None:
        _on_run()
    c = _model.cfg  # priced before it runs: every decoder position's cross-attention over the 30 s window
    memory.plan_capture("this transcription", layers=c.n_dec_layers, heads=c.n_heads, n=c.n_audio_ctx,
                        rows=c.n_text_ctx, shorten="the audio")
    if _mask is None:
        return _model.transcribe(_data, cut=True)
    # heads of the decoder switched off: the encoder's output is this audio's unmasked one (kept
    # per audio, bounded in bytes), so Apply runs only the decoder again
    plain_run = _transcribed(model_key, digest, mask_key(None, None), _model, _data, None, None, _on_run)
    encoded = cached_result(shared_cache("speech.encoder", 8, 64), (model_key, digest),
                            lambda: _encoded(_model, plain_run.features))
    return _model.transcribe(_data, head_mask=_mask, head_fill=_fill, cut=True, memory=encoded)


def _encoded(model, features):
    with torch.inference_mode():   # as transcribe runs it: the same (prepacked) path, the same numbers
        return model.encode_audio(features)[0]


@st.cache_resource(max_entries=4, show_spinner=False)
def _means(model_key: str, digest: str, _model, _tr):
    # the cross heads' mean outputs over this clip and its transcript (mean ablation's fill)
    return _model.head_means(_tr.features, _tr.ids)["cross"]


def transcript(model, data: bytes, mask=None, fill=None):
    """The (cached) transcript, or None after showing the error."""
    digest = hashlib.sha256(data).hexdigest()
    try:
        with st.spinner("Transcribing…"):
            return _transcribed(model.info.key, digest, mask_key(mask, fill), model, data, mask, fill, _counted)
    except ValueError as err:
        st.error(plain(str(err)))
        return None


def _counted():
    st.session_state[key("transcriptions")] = st.session_state.get(key("transcriptions"), 0) + 1


def transcriptions_note():
    n = st.session_state.setdefault(key("transcriptions"), 0)  # 0 when every result came from the cache
    st.caption(f"Transcriptions run in this session: {n} (one per clip, then one per Apply of a mask not "
               "heard before; a layer box or head click waits for Apply).")


# ---------------------------------------------------------------- views
def explain(model):
    c = model.cfg
    heads = ", ".join(names.head_name(l, h) for l, h in model.alignment_heads)
    with st.expander("Where Q, K and V come from", expanded=False):
        st.markdown(
            f"Whisper turns the sound into a **log-mel spectrogram** (80 frequency bands, one column per "
            f"10 ms, always 30 s: shorter audio is padded with silence). Two convolutions halve time to "
            f"{c.n_audio_ctx:,} **audio frames of 20 ms**, which the encoder ({c.n_enc_layers} layers) reads "
            f"with self-attention. The decoder ({c.n_dec_layers} layers) writes text tokens one at a time; "
            "in its **cross-attention** the **query** is the text position about to be written and the "
            "**keys and values** are the audio frames: row *t* says which moments of the sound the "
            "decoder listened to while choosing token *t*.\n\n"
            f"A few heads follow the speech so closely that Whisper times words with them — the "
            f"**alignment heads** listed in the model's `config.json`: {heads} (★ below). Their maps, "
            "normalised, median-filtered and averaged, are aligned with the tokens by dynamic time "
            "warping: where the path moves to the next word is that word's start.")


def summary(model, tr):
    st.subheader(tr.text or "(nothing heard)")
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("tokens", str(tr.n_tokens))
    c2.metric("log-probability", f"{float(tr.logprobs.sum()):.2f}")
    c3.metric("audio", f"{tr.seconds:.2f} s")
    c4.metric("source", f"{tr.audio.source_rate / 1000:g} kHz · {tr.audio.channels} ch")
    st.audio(tr.audio.samples, sample_rate=16_000)
    if tr.truncated_seconds:
        st.warning(f"The audio is {tr.audio.seconds:.1f} s long; Whisper hears 30 s at a time, so only the "
                   f"first 30 s are transcribed ({tr.truncated_seconds:.1f} s left out).")
    if tr.stopped == "deadline":
        st.warning(f"Decoding stopped at the time limit ({LIMITS.max_transcribe_seconds:g} s); the text is "
                   "what was written until then.")
    elif tr.stopped == "max_tokens":
        st.warning("Decoding stopped at the decoder's last position before the end of text.")


def head_options(model) -> list[str]:
    c, marked = model.cfg, set(model.alignment_heads)
    return [ALIGNMENT] + [names.head_name(l, h) + (" ★" if (l, h) in marked else "")
                          for l in range(c.n_dec_layers) for h in range(c.n_heads)]


def rows_of(model, tr, choice: str):
    """[n_tokens, n_frames]: one head's cross-attention, or the alignment heads' average."""
    if choice == ALIGNMENT:
        return torch.stack([tr.cross_attentions[l, h] for l, h in model.alignment_heads]).mean(0)
    layer, head = names.parse_head_name(choice.replace(" ★", ""))
    return tr.cross_attentions[layer, head]


def attention(model, tr):
    choice = st.selectbox("Cross-attention of", **shared_view.linked(key("head"), options=head_options(model)),
                          help="★ marks the alignment heads (config.json) that time the words.")
    fig = speech_figures.spectrogram_and_attention(tr.features, rows_of(model, tr, choice), tr.tokens, tr.audio_frames,
                                         tr.words, title=f"cross-attention · {choice} · tokens × time")
    st.plotly_chart(fig, key=key("spectrogram"))
    st.caption("Row t: where in the sound the decoder listened while choosing token t (the first row is "
               "chosen after the prompt <|startoftranscript|><|notimestamps|>). Dotted lines: word starts.")
    quiet = speech_figures.silent_seconds(speech_figures.mel_db(tr.features[:, :2 * tr.audio_frames]))
    st.caption("Spectrogram: dB below the clip's loudest moment, down to "
               f"{speech_figures.FLOOR_DB:g} dB (Whisper's own floor; darkest colour)."
               .replace("-", "−") + (f" {quiet:.1f} s of silence below {speech_figures.FLOOR_DB:g} dB".replace("-", "−")
                                      + " is drawn at the floor." if quiet >= 0.05 else ""))


def every_head(model, tr):
    st.plotly_chart(speech_figures.heads_grid(tr.cross_attentions, tr.audio_frames, model.alignment_heads),
                    key=key("grid"))
    st.caption("Every decoder layer and head, tokens × time over the audio; ★ the alignment heads.")


def words(model, tr):
    if not tr.words:
        st.info("No words to time (nothing was heard, or the model has no alignment heads).")
        return
    st.plotly_chart(speech_figures.words_figure(tr.audio.samples, 16_000, tr.words), key=key("words_fig"))
    st.dataframe([{"word": w.text.strip(), "start (s)": round(w.start, 2), "end (s)": round(w.end, 2),
                   "probability": round(w.probability, 3)} for w in tr.words], hide_index=True)
    for i, w in enumerate(tr.words[:MAX_PLAYERS]):
        left, right = st.columns([1, 4], vertical_alignment="center")
        left.markdown(f"**{plain(w.text.strip())}** · {w.start:.2f}–{w.end:.2f} s")
        with right:
            st.audio(tr.audio.samples, sample_rate=16_000, start_time=w.start, end_time=max(w.end, w.start + 0.1))
    if len(tr.words) > MAX_PLAYERS:
        st.caption(f"Players for the first {MAX_PLAYERS} words; the table lists all {len(tr.words)}.")


def heads_off(model, data: bytes, tr):
    """Switch cross-attention heads off with the shared editor; transcribe again beside it."""
    c = model.cfg
    shape = SimpleNamespace(n_layers=c.n_dec_layers, n_heads=c.n_heads)
    marked = torch.zeros(c.n_dec_layers, c.n_heads)
    for l, h in model.alignment_heads:
        marked[l, h] = 1.0
    st.caption("Cross-attention heads of the decoder. Coloured: the alignment heads (1) and the rest (0).")
    mode = ablation_choice(key("ablation"), "this clip's transcript")

    def effect(keep):
        if bool(keep.all()):
            st.info("Switch heads off in the grid, then Apply: the clip is transcribed again without them.")
            transcriptions_note()
            return None
        try:
            means = None if mode == "zero" else _means(model.info.key, hashlib.sha256(data).hexdigest(), model, tr)
        except ValueError as err:
            st.error(plain(str(err)))
            return None
        masked = transcript(model, data, keep, None if means is None else head_ablation.fill(keep, mode, means))
        if masked is None:
            return None

        def draw():
            transcriptions_note()
            st.markdown("**With those heads off:** " + plain(masked.text or "(nothing)"))
            st.markdown(diff_markdown(tr.text, masked.text).replace("translation", "transcript"))
            st.plotly_chart(speech_figures.heads_grid(masked.cross_attentions, masked.audio_frames, model.alignment_heads,
                                            off=np.asarray(keep.numpy() == 0)), key=key("off_grid"))
        return draw

    head_editor(shape, PAGE, marked, model_key=model.info.key, effect=effect,
                score_label="alignment head", link=True)


VIEWS = {
    "Spectrogram & cross-attention": lambda model, data, tr: attention(model, tr),
    "Every head": lambda model, data, tr: every_head(model, tr),
    "Word timestamps": lambda model, data, tr: words(model, tr),
    "Switch heads off": heads_off,
    "Corpus run": lambda model, data, tr: page_tool(PAGE, model),
}


def views(model, data: bytes, tr, drawn_before: bool):
    """The chosen view only (st.tabs would compute all five on every rerun); the choice is kept
    across buttons, the head editor's Apply and page switches. After a run that drew no radio
    (an upload on its way, an error) the browser draws a new radio at its first option while the
    session still holds the chosen view: the value is given again, so the radio shows the view
    drawn (and a click on the first option is a change the server sees)."""
    view = names.session_key(PAGE, "view")
    if not drawn_before and st.session_state.get(view) in VIEWS:
        st.session_state[view] = st.session_state[view]
    VIEWS[view_choice(PAGE, list(VIEWS))](model, data, tr)
    st.session_state[key("view_drawn")] = True


def page():
    body()
    shared_view.share_bar(PAGE)   # last: the link has every value this run set


def body():
    """The page in reading order: the audio, what the model is, the transcript, then the chosen view."""
    drawn_before = st.session_state.pop(key("view_drawn"), False)  # did the last run draw the view radio?
    picked = inputs()
    if picked is None:
        return
    model, data = picked
    if model.kind == "audio":
        speech_encoder_view.body(model, data, drawn_before)
        return
    explain(model)
    tr = transcript(model, data)
    if tr is None:
        return
    summary(model, tr)
    views(model, data, tr, drawn_before)
