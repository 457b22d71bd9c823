"""Figures of a transcription: the log-mel spectrogram with one head's (or the alignment heads')
cross-attention under it on one time axis, every cross-attention head as tokens x time, and the
word timestamps. Pure: arrays in, figures out. Time is in seconds: a log-mel frame is 10 ms, an
encoder frame (what cross-attention reads) 20 ms."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.base.names import head_name

MEL_SECONDS = 0.01       # one log-mel frame
FRAME_SECONDS = 0.02     # one encoder frame


def _array(values) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=np.float32)


def token_labels(tokens: list[str]) -> list[str]:
    """Unique y labels (plotly merges equal category labels): 'Ġworld' -> '3 ·world'."""
    return [f"{i} {t.replace('Ġ', '·')}" for i, t in enumerate(tokens)]


def spectrogram_and_attention(features, rows, tokens: list[str], audio_frames: int, words=(),
                              title: str = "") -> go.Figure:
    """features [n_mels, 2N] over rows [n_tokens, N] (one head, or an average), cropped to the
    audio (`audio_frames` encoder frames), sharing the time axis; words as dotted boundaries."""
    mel = _array(features)[:, :2 * audio_frames]
    att = _array(rows)[:, :audio_frames]
    n_tok = att.shape[0]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        row_heights=[0.35, 0.65], subplot_titles=("log-mel spectrogram", title))
    fig.add_trace(go.Heatmap(z=mel, x=np.arange(mel.shape[1]) * MEL_SECONDS, y=np.arange(mel.shape[0]),
                             colorscale="Magma", showscale=False,
                             hovertemplate="%{x:.2f} s · mel bin %{y}<br>%{z:.2f}<extra></extra>"),
                  row=1, col=1)
    labels = token_labels(tokens)
    fig.add_trace(go.Heatmap(z=att, x=(np.arange(att.shape[1]) + 0.5) * FRAME_SECONDS, y=labels,
                             colorscale="Viridis", showscale=False,
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


def heads_grid(cross, audio_frames: int, alignment_heads=(), off=None) -> go.Figure:
    """cross [L, H, n_tokens, N]: one tokens x time map per layer and head, cropped to the audio;
    alignment heads marked ★ in the title, switched-off heads (off [L, H] bool) '(off)'."""
    att = _array(cross)[..., :audio_frames]
    L, H = att.shape[:2]
    marked = {tuple(lh) for lh in alignment_heads}
    titles = [head_name(l, h) + (" ★" if (l, h) in marked else "")
              + (" (off)" if off is not None and bool(off[l][h]) else "") for l in range(L) for h in range(H)]
    fig = make_subplots(rows=L, cols=H, subplot_titles=titles, horizontal_spacing=0.01, vertical_spacing=0.06)
    x = (np.arange(att.shape[-1]) + 0.5) * FRAME_SECONDS
    for l in range(L):
        for h in range(H):
            fig.add_trace(go.Heatmap(z=att[l, h], x=x, colorscale="Viridis", showscale=False, zmin=0,
                                     hovertemplate=f"{head_name(l, h)}<br>token %{{y}}<br>%{{x:.2f}} s"
                                                   "<br>weight %{z:.3f}<extra></extra>"),
                          row=l + 1, col=h + 1)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    fig.update_annotations(font_size=10)
    fig.update_layout(height=int(np.clip(150 * L + 60, 260, 1200)), margin=dict(l=10, r=10, t=40, b=10))
    return fig


def words_figure(samples, rate: int, words) -> go.Figure:
    """The waveform's envelope (20 ms peaks) with each word's start..end as a band."""
    x = _array(samples)
    step = max(1, int(rate * FRAME_SECONDS))
    n = len(x) // step
    peaks = np.abs(x[:n * step]).reshape(n, step).max(1) if n else np.zeros(0)
    t = (np.arange(n) + 0.5) * step / rate
    fig = go.Figure(go.Scatter(x=np.concatenate([t, t[::-1]]), y=np.concatenate([peaks, -peaks[::-1]]),
                               fill="toself", line=dict(width=0.5, color="#4c78a8"), hoverinfo="skip",
                               name="waveform"))
    for i, w in enumerate(words):
        fig.add_vrect(x0=w.start, x1=max(w.end, w.start + 0.01), fillcolor="orange" if i % 2 else "gold",
                      opacity=0.25, line_width=0, annotation_text=w.text.strip(), annotation_position="top left")
    fig.update_layout(height=220, margin=dict(l=10, r=10, t=30, b=10), showlegend=False,
                      xaxis_title="seconds", yaxis=dict(showticklabels=False))
    return fig
