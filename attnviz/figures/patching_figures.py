"""Figures of activation patching: the recovered fraction as a layer x unit heatmap (layer 0 at
the top, as the head editor shows layers)."""
from __future__ import annotations

import plotly.graph_objects as go


def patch_heatmap(recovered, columns: list[str], title: str = "") -> go.Figure:
    """recovered [L, columns]: 0 = the corrupted run, 1 = the clean run; diverging around 0."""
    values = recovered.float().numpy()
    z = [[None if v != v else float(v) for v in row] for row in values]  # NaN (not patched) as a gap
    fig = go.Figure(go.Heatmap(z=z, x=list(range(len(columns))), y=list(range(values.shape[0])),
                               colorscale="RdBu", zmid=0, colorbar={"title": "recovered"},
                               customdata=[[c for c in columns] for _ in range(values.shape[0])],
                               hovertemplate="layer %{y}, %{customdata}: %{z:.4f}<extra></extra>"))
    fig.update_layout(title=title, height=max(300, 14 * values.shape[0] + 120),
                      xaxis={"tickmode": "array", "tickvals": list(range(len(columns))), "ticktext": columns},
                      yaxis={"autorange": "reversed", "title": "layer"}, margin={"l": 50, "r": 20, "t": 40, "b": 40})
    return fig
