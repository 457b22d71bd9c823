"""The Latency page in reading order: the sweep and its results, the edge device views, then each
section that prices one kind of model or checks the Pi model (each computes only when opened)."""
from __future__ import annotations

from attnviz.ui import latency, latency_published, latency_sensitivity, latency_speech, latency_translate


def page():
    latency.intro()
    latency.sweep_form()
    latency.results_views()
    latency.edge_views()
    latency_sensitivity.sensitivity_section()
    latency_published.published_section()
    latency_translate.translation_section()
    latency_speech.speech_section()
    latency.device_import()
