"""The Heads page's Corpus tool: a run over many texts (importance, pruning curve, 4 vs 8 heads, or the
editor's mask scored), with progress per text, Cancel, partial results kept, CSV export and resume.

The run is `corpus_runs.run` inside one heavy-job slot; ATTNVIZ_SCHEDULER sends its per-text work to
a Dask cluster (the replica then only waits for results). Every finished text is also written to a
results file, so a cancelled or interrupted run picks up where it stopped when Run is pressed again
with the same options; the file is removed once the run completes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import tempfile
from pathlib import Path

import pandas as pd
import streamlit as st

from attnviz.analysis import corpus, corpus_engine, corpus_metrics, corpus_runs, pruning
from attnviz.base import jobs
from attnviz.base.limits import LIMITS
from attnviz.base.names import session_key
from attnviz.figures import corpus_figures
from attnviz.latency import tradeoff
from attnviz.ui import common
from attnviz.ui.heads_tools import csv_download, partial_note, run_tracked

PAGE = "heads"
UPLOAD = "upload a file (.txt, .csv, .jsonl)"
ITEM_CHOICES = (5, 10, 20, 50, 100, 200, 500, 1000, 2000)
RESULTS_DIR = Path(tempfile.gettempdir()) / "attnviz-corpus-runs"


def K(name: str) -> str:
    return session_key(PAGE, name)


def text_corpora() -> dict[str, str]:
    """The bundled corpora this page's models (encoders and language models) read."""
    return {k: d for k, d in corpus.bundled_corpora().items() if corpus.BUNDLED[k][0] == "text"}


@st.cache_resource(max_entries=8, show_spinner=False)
def bundled(key: str) -> corpus.Corpus:
    """A bundled corpus, read once per server: shared, never mutated (runs take a copy's slice)."""
    return corpus.open_corpus(key)


def choose_corpus(view) -> corpus.Corpus | None:
    """The corpus picked or uploaded. A bad upload shows why and keeps the last good one."""
    ss = st.session_state
    choices = list(text_corpora()) + [UPLOAD]
    default = corpus.default_corpus("lm" if view.lm else "encoder")
    c1, c2 = st.columns([2, 1])
    pick = c1.selectbox("corpus", choices, index=choices.index(default), key=K("corpus_pick"),
                        format_func=lambda k: k if k == UPLOAD else f"{k}: {text_corpora()[k]}")
    if pick != UPLOAD:
        chosen = bundled(pick)
    else:
        up = c1.file_uploader("corpus file", type=["txt", "csv", "jsonl"], key=K("corpus_file"),
                              help="one text a line (.txt), or a column of a .csv / .jsonl; at most "
                                   f"{corpus.CorpusLimits().max_bytes:,} bytes are read")
        column = c2.text_input("text column (.csv / .jsonl)", "", key=K("corpus_column"), max_chars=200,
                               help="empty: 'text', else the first column; 'a+b' joins two columns as a "
                                    "sentence pair (an encoder then scores their similarity)")
        label = c2.text_input("label column (optional)", "", key=K("corpus_label"), max_chars=200,
                              help="a number per text, e.g. a similarity score: compared by Spearman "
                                   "correlation with each model's score")
        chosen = None
        if up is not None:
            wanted = (up.name, up.size, column.strip(), label.strip())
            if ss.get(K("corpus_upload"), (None,))[0] != wanted:
                try:
                    ss[K("corpus_upload")] = (wanted, corpus.open_corpus(
                        up.name, data=up.getvalue(), column=column.strip() or None,
                        label_column=label.strip() or None))
                except ValueError as err:
                    st.error(f"{common.plain(str(err)[:300])} — the corpus is unchanged.")
        got = ss.get(K("corpus_upload"))
        chosen = got[1] if got is not None else None
        if chosen is None:
            st.info("Upload a corpus file to run on it.")
            return None
    st.caption(f"{len(chosen):,} texts · {common.plain(chosen.source)} · licence: {common.plain(chosen.licence)}"
               + (" · labelled" if chosen.labels is not None else ""))
    for note in chosen.notes:
        st.caption(f"Cut: {common.plain(note)}.")
    return chosen


def first_items(chosen: corpus.Corpus, n: int) -> corpus.Corpus:
    if n >= len(chosen):
        return chosen
    labels = None if chosen.labels is None else chosen.labels[:n]
    return dataclasses.replace(chosen, items=chosen.items[:n], labels=labels, notes=list(chosen.notes))


def results_path(view, chosen: corpus.Corpus, kind: str, code: str | None, seed: int) -> Path:
    """One results file per model, corpus content, run kind, mask and seed: pressing Run again
    with the same options resumes it."""
    digest = hashlib.sha256()
    for part in (view.mkey, chosen.key, kind, code or "", str(seed), str(len(chosen))):
        digest.update(part.encode() + b"\0")
    for item in chosen.items:
        digest.update(str(item).encode() + b"\0")
    return RESULTS_DIR / f"{digest.hexdigest()[:24]}.jsonl"


def scheduler_note() -> str | None:
    """Where the run goes (ATTNVIZ_SCHEDULER), or None when the setting is not understood."""
    try:
        where = corpus_engine.resolve_scheduler(None)
    except ValueError as err:
        st.error(common.plain(str(err)))
        return None
    return "in this process" if where is None else f"on the Dask cluster at {where}"


def pi_latency(view, result) -> pd.DataFrame:
    """Raspberry Pi 4 / 5 latency of the full and the halved model at the corpus' mean length,
    from the Latency page's cost model (modelled, not measured)."""
    keep = result.extra.get("keep")
    if keep is None:
        return pd.DataFrame()
    return tradeoff.kept_heads_latency(view.cfg, keep, int(result.extra.get("tokens") or 64))


def show(view, result, metric: str):
    kind = result.kind
    st.caption(f"{result.done} of {result.total} texts' steps done · worked on: "
               + ", ".join(f"{w} ({n})" for w, n in result.extra.get("workers", {}).items()))
    if kind == "importance":
        if "importance" in result.extra:
            st.plotly_chart(corpus_figures.importance_figure(result.extra["importance"]), key=K("corpus_imp"))
    elif kind == "pruning_curve" and len(result.summary):
        st.plotly_chart(corpus_figures.curve_figure(result.summary, metric, result.extra.get("mark")),
                        key=K("corpus_curve"))
    elif len(result.summary):
        title = "the editor's mask" if kind == "mask" else "each layer's heads halved by importance"
        st.plotly_chart(corpus_figures.metrics_figure(result.summary, f"{title}: against the full model"),
                        key=K("corpus_bars"))
    if kind == "heads_4_vs_8" and len(result.summary):
        st.caption("Modelled Raspberry Pi latency of the full and the halved model (attnviz.latency.costmodel, "
                   "at the corpus' mean length):")
        st.dataframe(pi_latency(view, result), hide_index=True, key=K("corpus_pi"))
    if len(result.summary):
        st.dataframe(result.summary, hide_index=True, key=K("corpus_summary"))
        csv_download("Summary CSV", result.summary, f"corpus-{kind}-{view.mkey}-summary.csv", K("corpus_csv_s"))
    if len(result.table):
        csv_download("Per-text CSV", result.table, f"corpus-{kind}-{view.mkey}.csv", K("corpus_csv_t"))


def corpus_tool(view, keep):
    """Pick a corpus, a run kind and a metric; Run holds a heavy-job slot with progress and Cancel."""
    ss = st.session_state
    chosen = choose_corpus(view)
    if chosen is None:
        return
    c1, c2, c3, c4 = st.columns(4)
    kinds = list(corpus_runs.RUN_KINDS)
    # scoring the editor's mask is the quickest run and the natural first one
    kind = c1.selectbox("run", kinds, index=kinds.index("mask"), key=K("corpus_kind"), format_func=lambda k: k.replace("_", " "),
                        help="; ".join(f"{k.replace('_', ' ')}: {d}" for k, d in corpus_runs.RUN_KINDS.items()))
    mkind = "lm" if view.lm else "encoder"
    metrics = corpus_metrics.METRICS[mkind] + (["spearman_pruned"] if chosen.labels is not None else [])
    metric = c2.selectbox("metric", metrics, key=K(f"corpus_metric:{mkind}"),
                          help="the curve follows it (higher is better for top1, cosine, agreement)")
    options = [n for n in ITEM_CHOICES if n < len(chosen)] + [len(chosen)]
    n_items = c3.selectbox("texts (the first)", options, index=min(1, len(options) - 1), key=K("corpus_n"))
    cap = max(1, int(LIMITS.max_importance_seconds))
    budget = c4.number_input("time budget (s)", 1, cap, min(300, cap), key=K("corpus_budget"))
    where = scheduler_note()
    st.caption(f"{common.plain(corpus_runs.RUN_KINDS[kind])}. Runs {where or '—'}"
               + ("; scores the mask applied above." if kind == "mask" else "."))
    run_on = first_items(chosen, int(n_items))
    code = pruning.encode_mask(keep) if kind == "mask" else None
    store = K(f"corpus:{view.mkey}")
    disabled = where is None or (kind == "mask" and not keep.any())
    if st.button("Run on the corpus", key=K("corpus_go"), disabled=disabled):
        ss[store + ":stopped"] = None
        path = results_path(view, run_on, kind, code, 0)
        ss[store + ":options"] = (kind, metric)

        def job(progress, seconds, cancel):
            deadline = jobs.Deadline(seconds)
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            result = corpus_runs.run(view.mkey, run_on, kind, mask=code, metric=metric, progress=progress,
                                     should_stop=lambda: cancel() or deadline.expired(), resume=path)
            if result.complete:
                path.unlink(missing_ok=True)
            return result
        run_tracked(store, f"corpus {kind.replace('_', ' ')}", int(budget), job)
    partial_note(store, "corpus")
    if store in ss and ss[store][0] is not None:
        shown_kind, shown_metric = ss.get(store + ":options", (kind, metric))
        if (shown_kind, shown_metric) != (kind, metric):
            st.info("Shown: the last run's result; press Run for these options.")
        show(view, ss[store][0], shown_metric)
