"""The Latency page in reading order: the sweep and its results, the edge device views, then each
section that prices one kind of model or checks the Pi model (each computes only when opened)."""
from __future__ import annotations

from attnviz.ui import shared_view
from attnviz.ui import latency_import, latency_models, latency_sweep, latency_published, latency_sensitivity, latency_speech, latency_translate


def page():
    latency_sweep.intro()
    latency_sweep.sweep_form()
    latency_sweep.results_views()
    latency_sweep.edge_views()
    latency_models.pair_section()
    latency_sensitivity.sensitivity_section()
    latency_published.published_section()
    latency_translate.translation_section()
    latency_speech.speech_section()
    latency_import.device_import()
    shared_view.share_bar("latency")   # last: the link has every value this run set
