"""Layer 6, figures: every plotly / matplotlib / PIL builder, pure functions from arrays to figures.

Imports: plotly, matplotlib, PIL; attnviz.base, core, toys, weights, analysis, latency.
"""
