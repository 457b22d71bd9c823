"""Pure plotly builders for the guided step-by-step walk (no Streamlit): one step's matrix with
the followed query's row outlined and the other rows dimmed, that row alone as bars over the
keys, and the weighted value rows adding up to the query's output.

Every value drawn is the tensor given, unchanged; only colours and shapes are added.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.attention_figures import token_label
from attnviz.figures.lab_figures import matrix_figure, step_figure
from attnviz.figures.render import tick_positions

QUERY_ROW = "query row"       # the outline's shape name: tests and readers find the row by it
OUTLINE, DIM = "#ff7f0e", "rgba(255, 255, 255, 0.6)"
BAR, TOP_BAR, MASKED_BAR = "#4c78a8", "#ff7f0e", "#bdbdbd"
MAX_TICKS, MAX_BAR_TEXT = 40, 40    # above 40 bars the value labels overlap: hover gives them
TOP_PARTS = 5                       # value rows drawn one by one in the ·V figure; the rest summed


def _np(values) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=np.float32)


def highlight_row(figure: go.Figure, row: int, n_rows: int, n_cols: int) -> go.Figure:
    """Dim every row but `row` (white veils above and below it) and outline `row`."""
    for y0, y1 in ((-0.5, row - 0.5), (row + 0.5, n_rows - 0.5)):
        if y1 > y0:
            figure.add_shape(type="rect", x0=-0.5, x1=n_cols - 0.5, y0=y0, y1=y1, fillcolor=DIM,
                             line=dict(width=0), layer="above", name="dimmed rows")
    figure.add_shape(type="rect", x0=-0.5, x1=n_cols - 0.5, y0=row - 0.5, y1=row + 0.5,
                     line=dict(color=OUTLINE, width=3), layer="above", name=QUERY_ROW)
    return figure


def guided_heatmap(step, tokens: list[str], query: int, causal: bool = False) -> go.Figure:
    """One `head_recompute.Step` drawn as in the full view, the query's row outlined and the rest dimmed."""
    figure = step_figure(step, tokens, causal)
    n_rows, n_cols = step.shape
    figure.update_layout(height=int(np.clip(12 * n_rows + 160, 300, 560)))
    return highlight_row(figure, query, n_rows, n_cols)


def row_bars(values, labels: list[str] | None, title: str, top: int, masked: list[int] = (),
             masked_text: str = "−∞", value_title: str = "", over: str = "key") -> go.Figure:
    """One row as vertical bars, one per key (token labels on the axis) or per dimension (labels
    None). `top` is drawn in the highlight colour; `masked` keys get a grey bar of height 0 with
    `masked_text` (−∞ scores, 0 weights), so the row keeps every key in its place."""
    v = _np(values)
    n = len(v)
    masked = set(masked)
    shown = np.where(np.isfinite(v), v, 0.0)
    colours = [MASKED_BAR if j in masked else TOP_BAR if j == top else BAR for j in range(n)]
    text = [masked_text if j in masked else format(float(v[j]), ".2f") for j in range(n)] \
        if n <= MAX_BAR_TEXT else None
    hover = [token_label(t) for t in labels] if labels is not None else [str(j) for j in range(n)]
    figure = go.Figure(go.Bar(x=np.arange(n), y=shown, marker_color=colours, text=text,
                              textposition="outside", cliponaxis=False, customdata=hover,
                              hovertemplate=f"{over} %{{x}} %{{customdata}}: %{{y:.4f}}<extra></extra>"))
    if labels is not None:
        ticks = tick_positions(n, MAX_TICKS)
        figure.update_xaxes(tickmode="array", tickvals=ticks, ticktext=[hover[i] for i in ticks],
                            tickangle=-60, title=over)
    else:
        figure.update_xaxes(title=over)
    figure.update_yaxes(title=value_title, zeroline=True, zerolinecolor="#888")
    figure.update_layout(title=title, height=360, margin=dict(l=10, r=10, t=50, b=10), showlegend=False)
    return figure


def parts_figure(parts, z, tokens: list[str], query: int, top: int = TOP_PARTS) -> go.Figure:
    """z of the query as the sum of its weighted value rows: the `top` largest parts one per row
    ("0.62 × V[animal]"), the other keys' parts summed into one row, a line, then "= z". Each row
    is a (d_head,) vector; the rows above the line add up to the last one."""
    parts = list(parts)
    shown, rest = parts[:top], parts[top:]
    rows = [p.vector for p in shown]
    labels = [f"{p.weight:.2f} × V[{token_label(tokens[p.key])}]" for p in shown]
    if rest:
        rows.append(sum(p.vector for p in rest))
        labels.append(f"+ the other {len(rest)} keys")
    rows.append(z)
    labels.append(f"= z of {token_label(tokens[query])}")
    matrix = np.stack([_np(r) for r in rows])                   # (parts shown + 1, d_head)
    figure = matrix_figure(matrix, "weights × value rows add up to the output z", labels, None,
                           row_title="", col_title="d_head", height=90 + 34 * len(rows))
    figure.update_yaxes(tickmode="array", tickvals=np.arange(len(labels)), ticktext=labels)
    figure.add_shape(type="line", x0=-0.5, x1=matrix.shape[1] - 0.5, y0=len(rows) - 1.5,
                     y1=len(rows) - 1.5, line=dict(color="black", width=2), name="sum line")
    return figure


# each step's bars: (value axis, what the bars are, text on masked keys or None: no mask applied yet)
BAR_KINDS = {"scores": ("score q·k", "its score against each key", None),
             "scaled": ("scaled score", "its scaled scores", None),
             "masked": ("masked score", "its scores after the mask", "−∞"),
             "softmax": ("attention weight", "its attention weights (they sum to 1)", "0"),
             "weighted": ("share of z (along z)", "each key's part of its output z", None),
             "output": ("value", "the head's output", None)}


def guide_bars(g, tokens: list[str], query: int) -> go.Figure:
    """The bars for one `steps.GuideStep`: its row over the keys (over d_model for the output)."""
    value_title, what, masked_text = BAR_KINDS[g.key]
    title = f"row of {token_label(tokens[query])}: {what}"
    if g.over != "keys":
        return row_bars(g.row, None, f"{title}, {len(g.row)} numbers", g.top, value_title=value_title,
                        over="dimension")
    return row_bars(g.row, tokens, title, g.top, g.masked if masked_text else (), masked_text or "",
                    value_title)
