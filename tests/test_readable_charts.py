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


def _legend_shown(fig) -> bool:
    if fig.layout.showlegend is not None:
        return bool(fig.layout.showlegend)
    listed = [t for t in fig.data if t.showlegend is not False]
    return len(listed) >= 2 or any(t.showlegend is True for t in fig.data)


def _legend_clear_of_title(fig) -> bool:
    """Plotly draws the title in the top margin: a horizontal legend must hang under the plot (its
    top below the x axis); a vertical one stays at or below the plot's top edge."""
    legend = fig.layout.legend
    if legend.orientation == "h":
        return legend.y is not None and legend.y < 0 and legend.yanchor == "top"
    return (legend.y is None or legend.y <= 1) and legend.yanchor in (None, "auto", "top")


def _every_titled_figure_with_a_legend():
    """Every builder of the figures layer whose figure has (or is given, on its page) a title and a
    legend, on small inputs."""
    import numpy as np
    import torch
    from attnviz.analysis.head_ranking import rank_heads
    from attnviz.figures import (attention_figures, calibration_figures, corpus_figures, crossover_figures,
                                 translation_figures, vit_figures)
    from attnviz.latency import published

    def titled(fig, title="a title the page sets"):
        return fig.update_layout(title=fig.layout.title.text or title)

    curve = pd.DataFrame([dict(order=o, fraction=f, cosine_mean=1 - f, cosine_std=0.0, runs=1)
                          for o in ("importance", "random") for f in (0.0, 0.1)])
    speed = pd.DataFrame(dict(tokens=[32, 128], full_ms=[10.0, 40.0], pruned_ms=[8.0, 30.0]))
    modelled = pd.DataFrame(dict(device="pi4", tokens=[32, 128], full_ms=[50.0, 200.0], pruned_ms=[40.0, 150.0]))
    ns = [200, 400, 800]
    block = pd.DataFrame([dict(seq_len=n, measured=m, median_ms=n / 10 + n * n / 8000, attention_ms=n * n / 8000)
                          for n in ns for m in (True, False)])
    decode = pd.DataFrame(dict(model="smollm2", backend=["cpu", "cpu", "pi5", "pi5"], engine="torch", dtype="fp32",
                               threads=4, measured=[True, True, False, False], test="tg", depth=[0, 128] * 2,
                               tg_tps=[20.0, 18.0, 5.0, 4.0]))
    sweep = pd.concat([rows([64, 128]), rows([64, 128], "pi4")], ignore_index=True)
    summary = pd.DataFrame([dict(metric="cosine", order=o, fraction=f, value=1 - f, ci_low=0.9 - f, ci_high=1.0)
                            for o in ("importance", "random") for f in (0.0, 0.3)])
    costs = pd.DataFrame([dict(model="en-pt", backend=b, source_tokens=n, encode_ms=n / 2, decode_ms_per_token=3.0)
                          for b in ("cpu", "pi4") for n in (8, 16)])
    attn = torch.softmax(torch.randn(3, 4, 5, 5, generator=torch.Generator().manual_seed(0)), -1)
    return {
        "pruning curve (Heads)": titled(head_figures.curve_figure(curve, "cosine")),
        "importance map (Heads)": titled(head_figures.mark_off_heads(go.Figure(), torch.tensor([[True, False]]))),
        "pruned latency (Heads)": titled(head_figures.latency_figure(speed, modelled)),
        "token loss (Heads)": titled(head_figures.token_loss_figure(["a", "b", "c"], [1.0, 2.0], [1.5, 2.5])),
        "crossover (Latency)": crossover_figures.crossover_figure(block, 800.0, 700.0, "minilm", positions=512),
        "calibration (Latency)": titled(calibration_figures.calibration_figure(pd.DataFrame(published.table()))),
        "latency sweep (Latency)": latency_figures.latency_figure(sweep),
        "memory (Latency)": latency_figures.memory_figure(sweep),
        "growth (Latency)": latency_figures.growth_figure(sweep),
        "decode (Latency)": titled(latency_figures.decode_figure(decode)),
        "overlay (Latency)": latency_figures.overlay_figure(rows([64, 128]), rows([64, 128], "pi5"), "overlay"),
        "head ranking (Find heads)": attention_figures.head_rank_figure(rank_heads(attn, 3, 1), top=5, title="ranked"),
        "lines (Attention)": attention_figures.lines_figure(attn[0], list("abcde"), heads=[0, 2], title="lines"),
        "corpus curve (Corpus)": corpus_figures.curve_figure(summary, "cosine", mark=0.3),
        "translation cost (Translate)": titled(translation_figures.translation_cost_figure(costs)),
        "training runs (Lab)": titled(experiment_figures.curves_figure(
            {"a": ([1.0, 0.5, 0.25], [(2, 0.5)]), "b": ([1.0, 0.6, 0.3], [(2, 0.4)])})),
        "toy loss (Lab)": titled(lab_figures.loss_figure([1.0, 0.5, 0.25], [(2, 0.5)])),
        "toy ViT FLOPs (Lab)": titled(vit_figures.flops_figure(["a", "b"], [1_048_576, 131_072], [1_048_576] * 2)),
        "toy ViT accuracy (Lab)": titled(vit_figures.accuracy_figure(["full", "axial"], [228, 391], [400, 400], 1 / 3)),
    }


def test_no_figure_draws_its_legend_under_its_title():
    """A horizontal legend without a place sat above the plot, in the margin where the title is
    (token loss at y = 1.15, the Lab's training runs); every legend now hangs under the plot
    (`layout.legend_below`) or stays at the plot's right."""
    figures = _every_titled_figure_with_a_legend()
    both = {name: fig for name, fig in figures.items() if fig.layout.title.text and _legend_shown(fig)}
    assert len(both) >= 12, sorted(set(figures) - set(both))
    over = {name: fig.layout.legend.to_plotly_json() for name, fig in both.items() if not _legend_clear_of_title(fig)}
    assert not over, over


def test_every_legend_placed_by_a_figure_goes_through_the_one_helper():
    """A figure that places its legend by hand (legend=dict(...)) is how titles and legends came to
    overlap; the figures layer places legends with `layout.legend_below` only."""
    import pathlib
    import re
    from attnviz import figures
    folder = pathlib.Path(figures.__file__).parent
    by_hand = {p.name: m.group() for p in folder.glob("*.py")
               for m in re.finditer(r"legend=dict\(|legend_(orientation|x|y|yanchor)\s*=", p.read_text())}
    assert not by_hand, by_hand
