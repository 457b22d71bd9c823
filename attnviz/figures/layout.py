"""Layout every figure shares."""
from __future__ import annotations


def legend_below(y: float = -0.18) -> dict:
    """The one legend placement of every figure: horizontal, under the plot, its top at ``y`` (paper
    units, below the x axis and its title). Plotly draws a horizontal legend above the plot by
    default, in the top margin where the title is, so the two overlapped; one inside the plot hides
    data."""
    return dict(orientation="h", yanchor="top", y=y, x=0)
