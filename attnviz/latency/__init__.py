"""Layer 4, latency (beside analysis): the cost model and its calibration, sweeps, the results CSV,
the CLI behind `python -m attnviz.bench`.

Imports: attnviz.base, core, toys, weights.
"""
