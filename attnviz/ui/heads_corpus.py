"""The Corpus tool, one for every model kind: a run over many items (importance, pruning curve, 4 vs 8
heads, or the page's head mask scored), with progress per item, a running summary, Cancel, partial
results kept, CSV export and resume. The Heads page shows it among its tools (encoders, language
models); Translate, Speech and Images show the same tool (`page_tool`) with their bundled corpora,
uploads of their kind (text, audio or image files) and the mask of their own head editor.

The run is `corpus_runs.run` inside one heavy-job slot; ATTNVIZ_SCHEDULER sends its per-item work to
a Dask cluster (the replica then only waits for results). Every finished item is also written to a
results file, so a cancelled or interrupted run picks up where it stopped when Run is pressed again
with the same options; the file is removed once the run completes, and all of them together stay
within ATTNVIZ_CORPUS_RESULTS_MB (the oldest removed first).
"""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import streamlit as st

from attnviz.analysis import corpus, corpus_engine, corpus_metrics, corpus_runs, head_answers, pruning
from attnviz.base import jobs, private
from attnviz.base.limits import LIMITS
from attnviz.base.names import session_key
from attnviz.figures import corpus_figures
from attnviz.latency import corpus_cost, latency_answers, tradeoff
from attnviz.ui import common
from attnviz.ui.head_editor import applied_mask
from attnviz.ui.heads_tools import csv_download, partial_note, run_tracked

ITEM_CHOICES = (5, 10, 20, 50, 100, 200, 500, 1000, 2000)
RESULTS_FOLDER = "corpus-runs"   # in the server's private folder (base.private), never a shared name
NOUNS = {"text": "texts", "audio": "clips", "image": "photos"}
UPLOADS = {"text": ("upload a file (.txt, .csv, .jsonl)", ["txt", "csv", "jsonl"]),
           "audio": ("upload clips (.wav, .flac)", [s[1:] for s in corpus.AUDIO_SUFFIXES]),
           "image": ("upload photos (.png, .jpg, …)", [s[1:] for s in corpus.IMAGE_SUFFIXES])}
FITS_SHARE = 0.8          # the default item count's estimate stays within this share of the default budget
DEFAULT_BUDGET = 300      # seconds, when the server allows that much
REFERENCE_LABELS = {"full": "the full model", "native": "the package's native engine", "both": "both, side by side"}


class Tool:
    """One page's corpus tool for one model: its keys, model kind and corpora."""

    def __init__(self, page: str, model, keep):
        self.page, self.model, self.keep = page, model, keep
        self.mkey, self.cfg = model.info.key, model.cfg
        self.kind = corpus_metrics.model_kind(model)
        self.items = corpus.corpus_kind(self.kind)       # "text" | "audio" | "image"
        self.noun = NOUNS[self.items]

    def K(self, name: str) -> str:
        return session_key(self.page, name)

    def bundled_choices(self) -> dict[str, str]:
        return {k: d for k, d in corpus.bundled_corpora().items() if corpus.BUNDLED[k][0] == self.items}


@st.cache_resource(max_entries=8, show_spinner=False)
def bundled(key: str) -> corpus.Corpus:
    """A bundled corpus, read once per server: shared, never mutated (runs take a copy's slice)."""
    return corpus.open_corpus(key)


def _upload(tool: Tool, c1, c2) -> corpus.Corpus | None:
    """The uploaded corpus; a bad upload shows why and keeps the last good one."""
    ss, K = st.session_state, tool.K
    label, types = UPLOADS[tool.items]
    if tool.items == "text":
        up = c1.file_uploader("corpus file", type=types, key=K("corpus_file"),
                              help="one text a line (.txt), or a column of a .csv / .jsonl; at most "
                                   f"{corpus.CorpusLimits().max_bytes:,} bytes are read")
        column = c2.text_input("text column (.csv / .jsonl)", "", key=K("corpus_column"), max_chars=200,
                               help="empty: 'text', else the first column; 'a+b' joins two columns as a "
                                    "sentence pair (an encoder then scores their similarity)").strip()
        label_col = c2.text_input("label column (optional)", "", key=K("corpus_label"), max_chars=200,
                                  help="a number per text, e.g. a similarity score: compared by Spearman "
                                       "correlation with each model's score").strip()
        files = [up] if up is not None else []
    else:
        files = c1.file_uploader(f"{tool.noun} ({', '.join('.' + t for t in types)})", type=types,
                                 accept_multiple_files=True, key=K("corpus_files"),
                                 help=f"several files, one {tool.noun[:-1]} each") or []
        column = label_col = ""
    if files:
        wanted = (tuple((f.name, f.size) for f in files), column, label_col)
        if ss.get(K("corpus_upload"), (None,))[0] != wanted:
            try:
                if tool.items == "text":
                    got = corpus.open_corpus(files[0].name, data=files[0].getvalue(), column=column or None,
                                             label_column=label_col or None)
                else:
                    got = corpus.open_corpus([(f.name, f.getvalue()) for f in files])
                ss[K("corpus_upload")] = (wanted, got)
            except ValueError as err:
                st.error(f"{common.plain(str(err)[:300])} — the corpus is unchanged.")
    got = ss.get(K("corpus_upload"))
    if got is None or got[1].kind != tool.items:
        st.info(f"Upload {'a corpus file' if tool.items == 'text' else tool.noun} to run on it.")
        return None
    return got[1]


def choose_corpus(tool: Tool) -> corpus.Corpus | None:
    """The corpus picked or uploaded."""
    choices = {**tool.bundled_choices(), UPLOADS[tool.items][0]: ""}
    keys = list(choices)
    default = corpus.default_corpus(tool.kind, tool.mkey)
    c1, c2 = st.columns([2, 1])
    pick = c1.selectbox("corpus", keys, index=keys.index(default) if default in keys else 0,
                        key=tool.K("corpus_pick"), format_func=lambda k: f"{k}: {choices[k]}" if choices[k] else k)
    chosen = bundled(pick) if choices[pick] else _upload(tool, c1, c2)
    if chosen is None:
        return None
    st.caption(f"{len(chosen):,} {tool.noun} · {common.plain(chosen.source)} · licence: "
               f"{common.plain(chosen.licence)}" + (" · labelled" if chosen.labels is not None else ""))
    for note in chosen.notes:
        st.caption(f"Cut: {common.plain(note)}.")
    return chosen


def first_items(chosen: corpus.Corpus, n: int) -> corpus.Corpus:
    if n >= len(chosen):
        return chosen
    labels = None if chosen.labels is None else chosen.labels[:n]
    return dataclasses.replace(chosen, items=chosen.items[:n], labels=labels, notes=list(chosen.notes))


def _item_bytes(item) -> bytes:
    # surrogatepass: a name for any text, even one holding a lone surrogate (never an error here)
    if isinstance(item, corpus.MediaItem):
        return item.data
    return np.ascontiguousarray(item).tobytes() if isinstance(item, np.ndarray) else \
        str(item).encode("utf-8", "surrogatepass")


def results_path(folder: Path, mkey: str, chosen: corpus.Corpus, kind: str, code: str | None, seed: int,
                 reference: str = "full") -> Path:
    """One results file in `folder` per model, corpus content, run kind, mask, seed and reference:
    pressing Run again with the same options resumes it."""
    digest = hashlib.sha256()
    for part in (mkey, chosen.key, kind, code or "", str(seed), str(len(chosen)), reference):
        digest.update(part.encode() + b"\0")
    for item in chosen.items:
        digest.update(_item_bytes(item) + b"\0")
    return Path(folder) / f"{digest.hexdigest()[:24]}.jsonl"


def scheduler_note() -> str | None:
    """Where the run goes (ATTNVIZ_SCHEDULER), or None when the setting is not understood."""
    try:
        where = corpus_engine.resolve_scheduler(None)
    except ValueError as err:
        st.error(common.plain(str(err)))
        return None
    return "in this process" if where is None else f"on the Dask cluster at {where}"


def results_store() -> corpus_engine.ResultsStore | None:
    """The bounded folder of results files, or None (with the reason shown) for a bad budget or a
    private folder that cannot be trusted (checked on every Run: made 0700, ours, not a link)."""
    try:
        return corpus_engine.ResultsStore(private.private_dir(RESULTS_FOLDER), corpus_engine.results_budget())
    except ValueError as err:
        st.error(common.plain(str(err)))
        return None


def pi_latency(cfg, result) -> pd.DataFrame | str:
    """Raspberry Pi 4 / 5 latency of the full and the halved model at the corpus' mean length,
    from the Latency page's cost model (modelled, not measured); a sentence where it has none."""
    keep = result.extra.get("keep")
    if keep is None:
        return pd.DataFrame()
    try:
        return tradeoff.kept_heads_latency(cfg, keep, int(result.extra.get("tokens") or 64))
    except ValueError as err:
        return str(err)


def show(tool: Tool, result, metric: str):
    K, kind, noun = tool.K, result.kind, tool.noun
    st.caption(f"{result.done} of {result.total} {noun}' steps done · worked on: "
               + ", ".join(f"{w} ({n})" for w, n in result.extra.get("workers", {}).items()))
    if result.extra.get("resume_note"):
        st.caption(f"Resumed: {common.plain(result.extra['resume_note'])}.")
    scored = len(result.summary) and "order" in result.summary.columns
    if result.extra.get("running"):
        st.caption(f"Summary so far, over the {result.extra['running']} {noun} done: each metric's mean with a "
                   "normal 95 % interval. The full summary (bootstrap intervals, corpus-level figures) "
                   "comes when the run ends.")
    if kind == "importance" or (not scored and "importance" in result.extra):
        if "importance" in result.extra:
            st.plotly_chart(corpus_figures.importance_figure(result.extra["importance"]), key=K("corpus_imp"))
    elif kind == "pruning_curve" and scored:
        said = head_answers.corpus_curve_sentence(result.summary, metric, int(tool.model.mask_layers * tool.cfg.n_heads),
                                              int(result.summary["n"].max()))
        if said:
            st.info(said)
        st.plotly_chart(corpus_figures.curve_figure(result.summary, metric, result.extra.get("mark")),
                        key=K("corpus_curve"))
    elif scored:
        title = "the editor's mask" if kind == "mask" else latency_answers.halved_name(int(tool.cfg.n_heads))
        st.plotly_chart(corpus_figures.metrics_figure(result.summary, f"{title}: against the full model"),
                        key=K("corpus_bars"))
    if kind == "heads_4_vs_8" and scored:
        priced = pi_latency(tool.cfg, result)
        if isinstance(priced, str):
            st.caption(f"No modelled Raspberry Pi latency: {common.plain(priced)}")
        else:
            said = latency_answers.halved_sentence(result.summary, metric, head_answers.metric_name(metric),
                                                    int(tool.cfg.n_heads), priced, int(result.summary["n"].max()))
            if said:
                st.info(said)
            st.caption("Modelled Raspberry Pi latency of the full and the halved model (attnviz.latency.costmodel, "
                       "at the corpus' mean length):")
            st.dataframe(priced, hide_index=True, key=K("corpus_pi"))
    if len(result.summary):
        st.dataframe(result.summary, hide_index=True, key=K("corpus_summary"))
        csv_download("Summary CSV", result.summary, f"corpus-{kind}-{tool.mkey}-summary.csv", K("corpus_csv_s"))
    if len(result.table):
        csv_download(f"Per-{noun[:-1]} CSV", result.table, f"corpus-{kind}-{tool.mkey}.csv", K("corpus_csv_t"))


def item_tokens(tool: Tool, chosen: corpus.Corpus) -> list[int] | None:
    """Tokens of each item of the chosen corpus (None: not text), counted once per corpus and model."""
    ss, key = st.session_state, tool.K(f"corpus_tokens:{tool.mkey}:{chosen.key}:{len(chosen)}")
    if key not in ss:
        ss[key] = corpus_runs.item_tokens(tool.model, chosen.items) if chosen.kind == "text" else None
    return ss[key]


def rate(tool: Tool) -> tuple[float, str]:
    """GFLOP/s to price a run at: the last run's measured rate for this model, else a share of
    this machine's matmul peak."""
    measured = st.session_state.get(tool.K(f"corpus_rate:{tool.mkey}"))
    if measured:
        return measured, "the rate the last run of this model measured here"
    peak = corpus_cost.matmul_peak()
    return corpus_cost.ASSUMED_SHARE * peak, (f"{corpus_cost.ASSUMED_SHARE:.0%} of this machine's "
                                               f"{peak:.0f} GFLOP/s matmul peak, until the first batch measures it")


def priced(tool: Tool, chosen: corpus.Corpus, kind: str, n: int) -> dict | None:
    """The estimate of a run of `kind` over the first `n` items: dict(flops, seconds, tokens), or None."""
    tokens = item_tokens(tool, chosen)
    if not tokens:      # items that are not text, or a model the cost model does not price (translators)
        return None
    plan = corpus_runs.plan_for(tool.model, first_items(chosen, n), kind, tokens=tokens[:n])
    mean = float(np.mean(tokens[:n]))
    gflops, _ = rate(tool)
    return dict(corpus_cost.price(tool.cfg, plan, mean, gflops), tokens=mean, plan=plan)


def default_items(tool: Tool, chosen: corpus.Corpus, sizes: list[int], budget: float) -> int:
    """The most items (of `sizes`) whose pruning curve, the dearest common run, is estimated to
    finish inside FITS_SHARE of the budget (at least the fewest offered)."""
    if not item_tokens(tool, chosen):
        return min(1, len(sizes) - 1)
    return corpus_cost.fitting(tool.cfg, sizes, lambda n: priced(tool, chosen, "pruning_curve", n)["plan"],
                               lambda n: priced(tool, chosen, "pruning_curve", n)["tokens"], budget, rate(tool)[0],
                               FITS_SHARE)


def options(tool: Tool, chosen: corpus.Corpus):
    """Run kind, reference, metric, items and budget from the tool's widgets."""
    K = tool.K
    c1, c2, c3, c4, c5 = st.columns(5)
    kinds = list(corpus_runs.RUN_KINDS)
    # scoring the editor's mask is the quickest run and the natural first one
    kind = c1.selectbox("run", kinds, index=kinds.index("mask"), key=K("corpus_kind"),
                        format_func=lambda k: latency_answers.halved_name(int(tool.cfg.n_heads))
                        if k == "heads_4_vs_8" else k.replace("_", " "),
                        help="; ".join(f"{k.replace('_', ' ')}: {d}" for k, d in corpus_runs.RUN_KINDS.items()))
    refs = list(corpus_metrics.REFERENCES) if corpus_engine.has_native(tool.mkey) else ["full"]
    reference = c2.selectbox("score against", refs, key=K("corpus_reference"), format_func=REFERENCE_LABELS.get,
                             disabled=len(refs) == 1,
                             help="translators: the pruned translation against the full model's, against the "
                                  "translator package's own native engine's, or both columns")
    metrics = corpus_metrics.metric_names(tool.kind, reference) + \
        (["spearman_pruned"] if chosen.labels is not None else [])
    metric = c3.selectbox("metric", metrics, key=K(f"corpus_metric:{tool.kind}:{reference}"),
                          help="the curve follows it (higher is better except kl and wer)")
    sizes = [n for n in ITEM_CHOICES if n < len(chosen)] + [len(chosen)]
    cap = max(1, int(LIMITS.max_importance_seconds))
    n_items = c4.selectbox(f"{tool.noun} (the first)", sizes, key=K("corpus_n"),
                           index=default_items(tool, chosen, sizes, min(DEFAULT_BUDGET, cap)),
                           help="the default is the most whose pruning curve is estimated to finish in the "
                                "default budget")
    budget = c5.number_input("time budget (s)", 1, cap, min(DEFAULT_BUDGET, cap), key=K("corpus_budget"))
    return kind, reference, metric, int(n_items), int(budget)


def corpus_runner(page: str, model, keep):
    """Pick a corpus, a run kind and a metric; Run holds a heavy-job slot with progress, a running
    summary and Cancel. `keep`: the page's applied head mask ([L, H] bool), scored by a mask run."""
    ss = st.session_state
    tool = Tool(page, model, keep)
    chosen = choose_corpus(tool)
    if chosen is None:
        return
    kind, reference, metric, n_items, budget = options(tool, chosen)
    where = scheduler_note()
    st.caption(f"{common.plain(corpus_runs.RUN_KINDS[kind])}. Runs {where or '—'}"
               + ("; scores the mask applied in the head editor." if kind == "mask" else "."))
    run_on = first_items(chosen, n_items)
    estimate = priced(tool, chosen, kind, n_items)
    if estimate is not None:
        gflops, how = rate(tool)
        line = corpus_cost.describe(tool.cfg, estimate["plan"], estimate["tokens"], gflops)
        st.caption(f"Estimate: {line} ({how}); the budget is {budget} s.")
        if estimate["seconds"] > budget:
            st.warning(f"The estimate is over the {budget} s budget: the run stops before a batch that would "
                       "end past it, and Run again finishes it (or choose fewer items, or more seconds).")
    code = pruning.encode_mask(keep) if kind == "mask" else None
    store = tool.K(f"corpus:{tool.mkey}")
    disabled = where is None or (kind == "mask" and not keep.any())
    if st.button("Run on the corpus", key=tool.K("corpus_go"), disabled=disabled):
        files = results_store()
        if files is not None:
            ss[store + ":stopped"] = None
            path = results_path(files.folder, tool.mkey, run_on, kind, code, 0, reference)
            ss[store + ":options"] = (kind, metric)
            live, live_estimate = st.empty(), st.empty()
            mean = estimate["tokens"] if estimate is not None else None

            def job(progress, seconds, cancel):
                deadline = jobs.Deadline(seconds)

                def shown(done, total, partial):
                    progress(done, total, partial)
                    if partial is not None and "estimate" in partial.extra and mean is not None:
                        live_estimate.caption("Running: " + corpus_cost.describe(tool.cfg, partial.extra["estimate"],
                                                                                  mean))
                    if partial is not None and len(partial.summary):
                        live.dataframe(partial.summary, hide_index=True)

                # the budget is checked before each batch at the measured rate; the deadline stays the hard stop
                result = corpus_runs.run(tool.mkey, run_on, kind, mask=code, metric=metric, progress=shown,
                                         should_stop=lambda: cancel() or deadline.expired(), resume=path,
                                         reference=reference, results_store=files, budget=seconds)
                measured = mean and corpus_cost.measured_gflops(tool.cfg, result.extra.get("estimate", {}), mean)
                if measured:
                    ss[tool.K(f"corpus_rate:{tool.mkey}")] = measured
                if result.complete:
                    path.unlink(missing_ok=True)
                return result
            run_tracked(store, f"corpus {kind.replace('_', ' ')}", budget, job)
            live.empty()
            live_estimate.empty()
    partial_note(store, "corpus")
    if store in ss and ss[store][0] is not None:
        shown_kind, shown_metric = ss.get(store + ":options", (kind, metric))
        if (shown_kind, shown_metric) != (kind, metric):
            st.info("Shown: the last run's result; press Run for these options.")
        show(tool, ss[store][0], shown_metric)


def corpus_tool(view, keep):
    """The Heads page's entry (its tools' signature): the tool for the page's model and mask."""
    corpus_runner("heads", view.model, keep)


def page_tool(page: str, model):
    """The entry for Translate, Speech and Images: the tool under the mask last applied in that
    page's own head editor (rows: the layers `head_mask` switches, `model.mask_layers`)."""
    shape = SimpleNamespace(n_layers=int(model.mask_layers), n_heads=int(model.cfg.n_heads))
    st.caption(f"Runs the model over a corpus of {NOUNS[corpus.corpus_kind(corpus_metrics.model_kind(model))]}; "
               "a mask run scores the heads switched off in this page's head editor.")
    corpus_runner(page, model, applied_mask(shape, page, model.info.key).bool())
