"""Readable charts: log axes with units and whole labels (never "5, 2, 10k, 5, 2"), a sweep of one length
drawn as bars, milliseconds to three significant figures, and peak memory that says what it counts."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from attnviz.base.numbers import blank, ms
from attnviz.figures import experiment_figures, head_figures, latency_figures, lab_figures


def rows(lengths, backend="cpu"):
    return pd.DataFrame([dict(model="minilm", variant="fused", n_heads=12, threads=2, backend=backend, engine="",
                              dtype="fp32", measured=backend == "cpu", seq_len=n, median_ms=127.4836 + n,
                              p10_ms=120.0 + n, p90_ms=130.0 + n, peak_mem_mb=3.0) for n in lengths])


def test_milliseconds_are_written_to_three_significant_figures():
    assert [ms(x) for x in (127.4836, 12.74836, 1.274836, 1274.836, 0.0012748)] == \
        ["127", "12.7", "1.27", "1,275", "0.00127"]
    assert ms(float("nan")) == "" and blank(None) == "" and blank(float("nan")) == "" and blank(0.5) == 0.5


def test_a_single_length_sweep_is_drawn_as_bars_labelled_in_ms():
    fig = latency_figures.latency_figure(pd.concat([rows([128]), rows([128], "pi4")]))
    assert {t.type for t in fig.data} == {"bar"} and "n = 128 tokens" in fig.layout.title.text
    assert fig.data[0].text[0] == "255 ms"
    line = latency_figures.latency_figure(rows([64, 128]))
    assert line.data[0].type == "scatter" and list(line.data[0].text) == ["191", "255"]


def test_every_log_axis_names_its_unit_and_labels_its_ticks_in_full():
    curve = pd.DataFrame([dict(order=o, fraction=f, perplexity_mean=10 + f, perplexity_std=0.0, runs=1)
                          for o in ("importance", "random") for f in (0.0, 0.1)])
    speed = pd.DataFrame(dict(tokens=[32, 128], full_ms=[10.0, 40.0], pruned_ms=[8.0, 30.0]))
    axes = [head_figures.curve_figure(curve, "perplexity", log_y=True).layout.yaxis,
            head_figures.latency_figure(speed).layout.xaxis, head_figures.latency_figure(speed).layout.yaxis,
            experiment_figures.curves_figure({"a": ([1.0, 0.5, 0.25], [(2, 0.5)])}).layout.yaxis,
            lab_figures.loss_figure([1.0, 0.5, 0.25]).layout.yaxis]
    for axis in axes:
        assert axis.type == "log" and axis.minorloglabels == "complete", axis   # not plotly's "5, 2, 10k"
        assert "log scale" in axis.title.text
    assert "ms" in axes[2].title.text and "tokens" in axes[1].title.text and "nats" in axes[3].title.text
    assert "nats" in axes[4].title.text


def test_the_logit_lens_writes_its_tokens_at_a_readable_size():
    import numpy as np
    from attnviz.figures import readout_figures
    fig = readout_figures.lens_figure(np.full((3, 2), 0.5), [["a", "b"]] * 3, np.full((3, 2), 0.5), ["x", "y"],
                                      ["embed", "L0", "L1"], ["a", "b"])
    assert fig.data[0].textfont.size >= 12


def test_speech_word_bands_cover_the_audio_between_words():
    from types import SimpleNamespace
    import numpy as np
    from attnviz.figures import speech_figures
    words = [SimpleNamespace(text=" hello", start=0.2, end=0.5), SimpleNamespace(text=" world", start=0.8, end=1.1)]
    shapes = speech_figures.words_figure(np.zeros(16_000 * 2, np.float32), 16_000, words).layout.shapes
    assert [(s.x0, s.x1) for s in shapes] == [(0.2, 0.8), (0.8, 1.1)]    # no unmarked gap at 0.5-0.8 s


def test_two_prompts_default_pair_differs_before_the_words_that_read_it():
    """Before: the pair differed in its last word only, so a causal model attended alike everywhere
    but there; now the last "it" reads "big" or "small"."""
    from attnviz.ui import common
    from attnviz.ui.readouts_page import PAIR
    model = common.shared_model("smollm2")
    a, b = (model.trace(text) for text in PAIR)
    assert a.n == b.n
    differs = (a.attentions - b.attentions).abs().amax(dim=(0, 1, 3)) > 1e-4      # per query position
    assert int(differs.sum()) >= 3 and bool(differs[-1])


def test_a_title_never_sits_over_a_legend():
    """The Heads page titles its pruning curves and importance map; their legends go under the plot."""
    import torch
    curve = pd.DataFrame([dict(order=o, fraction=f, cosine_mean=1 - f, cosine_std=0.0, runs=1)
                          for o in ("importance", "random") for f in (0.0, 0.1)])
    fig = head_figures.curve_figure(curve, "cosine")
    heat = head_figures.mark_off_heads(go.Figure(), torch.tensor([[True, False]]))
    for f in (fig, heat):
        assert f.layout.legend.y < 0 and f.layout.legend.yanchor == "top"
