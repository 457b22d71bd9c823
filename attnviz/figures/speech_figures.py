"""Figures of a transcription: the log-mel spectrogram with one head's (or the alignment heads')
cross-attention under it on one time axis, every cross-attention head as tokens x time, and the
word timestamps; of a speech encoder (wav2vec 2.0, HuBERT): one head's frames x frames under the
waveform, and how far switching heads off moved each frame's output. Pure: arrays in, figures out.
Time is in seconds: a log-mel frame is 10 ms, an encoder frame (what cross-attention reads) 20 ms."""
from __future__ import annotations

import numpy as np
import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.base.names import head_name

MEL_SECONDS = 0.01       # one log-mel frame
FRAME_SECONDS = 0.02     # one encoder frame
# Whisper's features are (log10(mel), clamped to its max - 8, + 4) / 4: 40 dB per unit, and the
# clamp sits 80 dB below the window's loudest value. So the spectrogram is drawn in dB below the
# clip's own peak, floored at peak - 80 dB, where Whisper's own floor is: digital silence sits at
# the floor, drawn in the scale's dark end, and said so in a caption.
DB_PER_UNIT = 40.0
FLOOR_DB = -80.0
SILENT_MARGIN_DB = 0.5   # a frame whose loudest band is within this of the floor is silence
# Magma (perceptually ordered, dark = quiet) as rgb() strings: Streamlit's chart theme replaces the
# hex colours #000001..#000010 in a figure by its own palette, and Magma's darkest is #000004,
# which the browser drew as Streamlit's pink.
MEL_COLOURS = [[pos, "rgb({}, {}, {})".format(*plotly.colors.hex_to_rgb(c))]
               for pos, c in zip(np.linspace(0.0, 1.0, len(plotly.colors.sequential.Magma)).tolist(),
                                 plotly.colors.sequential.Magma)]


def mel_db(features) -> np.ndarray:
    """Log-mel features as dB below their loudest value, floored at FLOOR_DB."""
    mel = _array(features)
    if not mel.size:
        return mel
    return np.maximum(DB_PER_UNIT * (mel - mel.max()), FLOOR_DB)


def silent_seconds(mel: np.ndarray) -> float:
    """Seconds of a dB spectrogram (`mel_db`, [n_mels, frames]) whose every band is at the floor."""
    if not mel.size:
        return 0.0
    return float((mel.max(axis=0) <= FLOOR_DB + SILENT_MARGIN_DB).sum()) * MEL_SECONDS


def _array(values) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=np.float32)


def token_labels(tokens: list[str]) -> list[str]:
    """Unique y labels (plotly merges equal category labels): ' world' -> '3 world'."""
    return [f"{i} {t.lstrip(' ') or t}" for i, t in enumerate(tokens)]


def spectrogram_and_attention(features, rows, tokens: list[str], audio_frames: int, words=(),
                              title: str = "") -> go.Figure:
    """features [n_mels, 2N] over rows [n_tokens, N] (one head, or an average), cropped to the
    audio (`audio_frames` encoder frames), sharing the time axis; words as dotted boundaries."""
    mel = mel_db(_array(features)[:, :2 * audio_frames])
    att = _array(rows)[:, :audio_frames]
    n_tok = att.shape[0]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        row_heights=[0.35, 0.65], subplot_titles=("log-mel spectrogram (dB below the clip's peak, floor "
                                        + f"{FLOOR_DB:g} dB)".replace("-", "−"), title))
    fig.add_trace(go.Heatmap(z=mel, x=np.arange(mel.shape[1]) * MEL_SECONDS, y=np.arange(mel.shape[0]),
                             colorscale=MEL_COLOURS, zmin=FLOOR_DB, zmax=0.0,
                             colorbar=dict(title=dict(text="dB below peak"), len=0.33, y=1.0, yanchor="top",
                                           thickness=12, tickvals=[0, -20, -40, -60, -80],
                                           ticktext=["peak", "−20 dB", "−40 dB", "−60 dB", "−80 dB"]),
                             hovertemplate="%{x:.2f} s · mel bin %{y}<br>%{z:.1f} dB<extra></extra>"),
                  row=1, col=1)
    labels = token_labels(tokens)
    fig.add_trace(go.Heatmap(z=att, x=(np.arange(att.shape[1]) + 0.5) * FRAME_SECONDS, y=labels,
                             colorscale="Viridis", zmin=0.0,
                             colorbar=dict(title=dict(text="weight"), len=0.6, y=0.0, yanchor="bottom", thickness=12),
                             hovertemplate="token %{y}<br>%{x:.2f} s<br>weight %{z:.3f}<extra></extra>"),
                  row=2, col=1)
    for w in words:
        for row in (1, 2):
            fig.add_vline(x=w.start, line=dict(color="white", width=1, dash="dot"), row=row, col=1)
        fig.add_annotation(x=(w.start + w.end) / 2, y=mel.shape[0], text=w.text.strip(), showarrow=False,
                           yanchor="bottom", font=dict(size=11), row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=2, col=1)
    fig.update_yaxes(title_text="mel bin", row=1, col=1)
    fig.update_xaxes(title_text="seconds", row=2, col=1)
    fig.update_layout(height=int(np.clip(260 + 22 * n_tok, 420, 1100)), margin=dict(l=10, r=10, t=50, b=10))
    return fig


def heads_grid(cross, audio_frames: int, alignment_heads=(), off=None, rows: str = "tokens",
               frame_seconds: float = FRAME_SECONDS) -> go.Figure:
    """cross [L, H, n_tokens, N]: one tokens x time map per layer and head, cropped to the audio
    (a speech encoder's self-attention [L, H, N, N]: `rows="frames"`, frames `frame_seconds` long),
    each scaled to its own largest weight, tiled into ONE heatmap (24 heatmap subplots took
    seconds to draw at every rerun of the page); alignment heads marked ★ in their label,
    switched-off heads (off [L, H] bool) '(off)'."""
    att = _array(cross)[..., :audio_frames]
    L, H, n_tok, n_frames = att.shape
    marked = {tuple(lh) for lh in alignment_heads}
    gap_y, gap_x = max(1, n_tok // 4), max(2, n_frames // 40)
    tall, wide = n_tok + gap_y, n_frames + gap_x
    tiles = np.full((L * tall - gap_y, H * wide - gap_x), np.nan, dtype=np.float32)
    peak = att.max(axis=(2, 3), keepdims=True)
    scaled = att / np.where(peak > 0, peak, 1.0)
    for l in range(L):
        for h in range(H):
            tiles[l * tall:l * tall + n_tok, h * wide:h * wide + n_frames] = scaled[l, h]
    fig = go.Figure(go.Heatmap(z=tiles, colorscale="Viridis", zmin=0.0, zmax=1.0, hoverongaps=False,
                               colorbar=dict(title=dict(text="weight / head's max"), thickness=12),
                               hovertemplate="row %{y} · column %{x}<br>%{z:.2f} of the head's max<extra></extra>"))
    for l in range(L):
        for h in range(H):
            label = head_name(l, h) + (" ★" if (l, h) in marked else "") + (
                " (off)" if off is not None and bool(off[l][h]) else "")
            fig.add_annotation(x=h * wide, y=l * tall, text=label, showarrow=False, xanchor="left", yanchor="bottom",
                               font=dict(size=10), bgcolor="rgba(255,255,255,0.7)")
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False, autorange="reversed")
    fig.update_layout(height=int(np.clip(150 * L + 60, 260, 1200)), margin=dict(l=10, r=10, t=40, b=10),
                      title=f"every head: {rows} × time ({audio_frames * frame_seconds:.2f} s), each scaled to its "
                            "own largest weight")
    return fig


def _envelope(samples, rate: int, seconds: float):
    """(times, peaks): the waveform's peak every `seconds`, at the middle of each stretch."""
    x = _array(samples)
    step = max(1, int(round(rate * seconds)))
    n = len(x) // step
    peaks = np.abs(x[:n * step]).reshape(n, step).max(1) if n else np.zeros(0)
    return (np.arange(n) + 0.5) * step / rate, peaks


def frames_figure(samples, rate: int, att, frame_seconds: float, title: str) -> go.Figure:
    """A speech encoder's head over a clip: the waveform's envelope above, its attention [n, n]
    below on the same time axis (row: the frame reading, column: the frame read; both at their
    frame's middle)."""
    att = _array(att)
    t = (np.arange(att.shape[0]) + 0.5) * frame_seconds
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.18, 0.82], vertical_spacing=0.03)
    times, peaks = _envelope(samples, rate, frame_seconds)
    fig.add_trace(go.Scatter(x=np.concatenate([times, times[::-1]]), y=np.concatenate([peaks, -peaks[::-1]]),
                             fill="toself", line=dict(width=0.5, color="#4c78a8"), hoverinfo="skip"), row=1, col=1)
    fig.add_trace(go.Heatmap(z=att, x=t, y=t, colorscale="Viridis", zmin=0.0,
                             colorbar=dict(title=dict(text="weight"), thickness=12),
                             hovertemplate="frame at %{y:.3f} s reads %{x:.3f} s: %{z:.3f}<extra></extra>"),
                  row=2, col=1)
    fig.update_yaxes(showticklabels=False, row=1, col=1)
    fig.update_yaxes(title_text="frame reading (s)", autorange="reversed", row=2, col=1)
    fig.update_xaxes(title_text="frame read (s)", row=2, col=1)
    fig.update_layout(height=int(np.clip(300 + 2 * att.shape[0], 520, 1000)), showlegend=False, title=title,
                      margin=dict(l=10, r=10, t=50, b=10))
    return fig


def change_figure(change, frame_seconds: float) -> go.Figure:
    """change [n]: 1 - cosine similarity of each frame's output with and without the heads switched off."""
    change = _array(change)
    t = (np.arange(len(change)) + 0.5) * frame_seconds
    fig = go.Figure(go.Scatter(x=t, y=change, mode="lines", line=dict(color="#e45756"),
                               hovertemplate="%{x:.3f} s: %{y:.4f}<extra></extra>"))
    fig.update_layout(height=240, margin=dict(l=10, r=10, t=40, b=10), xaxis_title="seconds",
                      yaxis_title="1 − cosine", title="how far each frame's output moved")
    return fig


def words_figure(samples, rate: int, words) -> go.Figure:
    """The waveform's envelope (20 ms peaks) with a band per word from its start to the next word's start
    (the last: to its end), so the audio between two words lies in a band, not in an unmarked gap that
    reads as "nothing was heard"; the table beside it keeps each word's own start and end."""
    t, peaks = _envelope(samples, rate, FRAME_SECONDS)
    fig = go.Figure(go.Scatter(x=np.concatenate([t, t[::-1]]), y=np.concatenate([peaks, -peaks[::-1]]),
                               fill="toself", line=dict(width=0.5, color="#4c78a8"), hoverinfo="skip",
                               name="waveform"))
    for i, w in enumerate(words):
        end = max(w.end, words[i + 1].start) if i + 1 < len(words) else w.end
        fig.add_vrect(x0=w.start, x1=max(end, w.start + 0.01), fillcolor="orange" if i % 2 else "gold",
                      opacity=0.25, line_width=0, annotation_text=w.text.strip(), annotation_position="top left")
    fig.update_layout(height=220, margin=dict(l=10, r=10, t=30, b=10), showlegend=False,
                      xaxis_title="seconds", yaxis=dict(showticklabels=False))
    return fig
