"""Activation patching views: on the Readouts page (a language model: logit difference; an encoder:
the sentence embedding's distance or cosine), the recovered fraction per head output / Q / K / V
group / residual position, path patching from every sender head into one receiver's Q / K / V,
and the top heads next to direct logit attribution's; on the Translate page (`translate_view`),
cross-attention heads and the encoder residual. Heatmaps and CSV."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from attnviz.analysis import patching, patching_paths, patching_translate, readouts
from attnviz.base import exports, jobs, names
from attnviz.base.limits import LIMITS
from attnviz.figures import patching_figures
from attnviz.ui import job_controls, kept_inputs, shared_view
from attnviz.ui.common import plain

CONVENTIONS = ("TransformerLens's conventions: the metric is logit[target] - logit[minus] at the last "
               "position; each cell is one activation of the corrupted run replaced by the clean run's, "
               "scored (patched - corrupted) / (clean - corrupted): 0 changes nothing, 1 restores the clean "
               "run. Head outputs and Q per query head, K and V per K/V group (GQA), residual = block input "
               "at one position.")
ENCODER_CONVENTIONS = ("An encoder has no next-token logits: the metric compares the sentence embedding "
                       "(mean-pooled over every token, L2-normalised) with the clean run's. Distance: minus "
                       "the Euclidean distance, so the recovered fraction is 1 - |e - e_clean| / |e_corrupted "
                       "- e_clean|, the share of the clean-corrupted distance closed; cosine: (cos - "
                       "cos_corrupted) / (1 - cos_corrupted).")
PATH_CONVENTION = ("Path patching (Wang et al. 2022, as ARENA's TransformerLens walkthrough does it): for each "
                   "sender head, the corrupted prompt runs with only the sender's output taken from the clean "
                   "run and every other head's output frozen at the corrupted run's (MLPs recomputed) up to the "
                   "receiver's layer; the receiver's Q (one query head) or K / V (its K/V group) is taken from "
                   "that run and patched into a fresh corrupted run, and nothing else. Each cell is the sender; "
                   "rows from the receiver's layer on are blank.")
TRANSLATE_CONVENTIONS = ("Both sources are translated greedily and the clean translation is teacher-forced in "
                         "every run, up to the first target token where the two translations part; the metric "
                         "is logit[clean token] - logit[corrupted token] there. A cell is one activation of the "
                         "corrupted source's run replaced by the clean source's: a cross-attention head's "
                         "output, or an encoder block's input at one source position. Recovered = (patched - "
                         "corrupted) / (clean - corrupted).")
PATH = "path"


def _check():
    # the heavy-job slot is the library's; this session's Cancel and a deadline bound it
    return jobs.checks(job_controls.session_cancel(), jobs.Deadline(LIMITS.max_importance_seconds, "patching"))


def _bar():
    bar = st.progress(0.0, text="patching")
    return lambda d, t: bar.progress(d / t, text=f"patched {d} of {t}")


def view(model, page: str):
    key = (lambda name: f"{page}.patch_{name}")
    encoder = model.kind == "encoder"
    st.caption(ENCODER_CONVENTIONS if encoder else CONVENTIONS)
    st.session_state.setdefault(key("clean"), patching.SAMPLE_CLEAN)
    st.session_state.setdefault(key("corrupted"), patching.SAMPLE_CORRUPTED)
    st.session_state.setdefault(key("target"), " Mary")
    st.session_state.setdefault(key("minus"), " John")
    clean = st.text_input("Clean prompt", **shared_view.linked(key("clean"), kept_inputs.LINK_CHARS))
    corrupted = st.text_input("Corrupted prompt", **shared_view.linked(key("corrupted"), kept_inputs.LINK_CHARS))
    if encoder:
        metric = st.radio("Metric", horizontal=True,
                          **shared_view.linked(key("metric"), format_func=patching.METRICS.get, options=patching.ENCODER_METRICS))
        target = minus = None
    else:
        metric = None
        left, right = st.columns(2)
        target = left.text_input("Target token", **shared_view.linked(key("target"), 100))
        minus = right.text_input("Minus token", **shared_view.linked(key("minus"), 100))
    kinds = list(patching.KIND_NAMES) + [PATH]
    kind = st.radio("Patch", horizontal=True,
                    **shared_view.linked(key("kind"), options=kinds,
                                         format_func=lambda k: patching.KIND_NAMES.get(k, "path to a head's Q / K / V")))
    pair = patching.prepare(model, clean, corrupted, target, minus, metric=metric)
    receiver = receiver_picker(model, key) if kind == PATH else None
    runs = patching_paths.count(model, receiver[0]) if receiver else patching.count(model, kind, pair)
    st.write(f"Clean {patching.METRICS[pair.metric]} {pair.clean_diff:.4f}; corrupted {pair.corrupted_diff:.4f}; "
             f"{runs} patched runs.")
    asked = (model.info.key, clean, corrupted, pair.target, pair.minus, pair.metric, kind, receiver)
    kept = st.session_state.get(key("result"))
    if st.button("Run patching", key=key("run")):
        if receiver:
            result = patching_paths.path_map(model, pair, *receiver, check=_check(), progress=_bar())
        else:
            result = patching.patch_map(model, pair, kind, check=_check(), progress=_bar())
        st.session_state[key("result")] = kept = (asked, result)
    if kept is None or kept[0] != asked:
        return
    result = kept[1]
    title = f"recovered fraction: {patching.KIND_NAMES.get(kind, result.kind)}"
    if receiver:
        st.caption(PATH_CONVENTION)
    st.plotly_chart(patching_figures.patch_heatmap(result.recovered, result.columns, title), key=key("map"))
    st.write(plain("Top: " + ", ".join(f"L{layer} {result.columns[c]} {v:.3f}" for layer, c, v in result.top(5))))
    st.download_button("Patching CSV", exports.csv_text(patching.patch_frame(result)), "patching.csv",
                       "text/csv", key=key("csv"))
    if kind == "z" and not encoder:
        st.caption("Patching measures a head's whole effect (through every later layer); direct logit "
                   "attribution only what it writes straight into the clean prompt's logit difference.")
        st.dataframe(compare_frame(model, clean, pair, result), hide_index=True, key=key("dla_compare"))


def receiver_picker(model, key) -> tuple[int, int, str]:
    """The receiver: a layer (1..L-1), its input (Q, K or V), a query head or a K/V group."""
    cfg = model.cfg
    left, mid, right = st.columns(3)
    st.session_state.setdefault(key("recv_layer"), cfg.n_layers - 1)
    layer = left.selectbox("Receiver layer", range(1, cfg.n_layers), key=key("recv_layer"))
    what = mid.radio("Receiver input", patching_paths.RECEIVER_KINDS, horizontal=True, key=key("recv_kind"),
                     format_func=str.upper)
    if what == "q":
        unit = right.selectbox("Receiver head", [int(h) for h in model.net.blocks[layer].attn.heads.tolist()],
                               key=key("recv_head"), format_func=lambda h: names.head_name(layer, h))
    else:
        unit = right.selectbox("Receiver K/V group", range(model.net.blocks[layer].attn.n_kv), key=key("recv_group"),
                               format_func=lambda g: f"KV{g} (heads {g * cfg.group}-{(g + 1) * cfg.group - 1})")
    return int(layer), int(unit), what


def compare_frame(model, clean: str, pair: patching.Pair, result: patching.Patched, k: int = 5) -> pd.DataFrame:
    """The top-k heads by patching (head outputs) next to the top-k by direct logit attribution on
    the clean prompt, for the same target and minus tokens."""
    att = readouts.attribution(model, clean, pair.target, pair.minus)
    flat = att.heads.flatten()
    order = flat.argsort(descending=True)[:k].tolist()
    H = att.heads.shape[1]
    rows = []
    for rank, ((layer, head, rec), i) in enumerate(zip(result.top(k), order), 1):
        rows.append({"rank": rank, "patching head": names.head_name(layer, head), "recovered": round(rec, 4),
                     "attribution head": names.head_name(i // H, i % H), "direct contribution": round(float(flat[i]), 4)})
    return pd.DataFrame(rows)


def translate_view(model, page: str):
    """The Translate page's patching section: a source and a corrupted source, cross-attention heads
    or the encoder residual per source position. Runs only on its button."""
    key = (lambda name: f"{page}.patch_{name}")
    st.caption(TRANSLATE_CONVENTIONS)
    st.session_state.setdefault(key("clean"), patching_translate.SAMPLE_CLEAN)
    st.session_state.setdefault(key("corrupted"), patching_translate.SAMPLE_CORRUPTED)
    clean = st.text_input("Source", key=key("clean"))
    corrupted = st.text_input("Corrupted source", key=key("corrupted"), help="the same sentence with one word swapped")
    kind = st.radio("Patch", list(patching_translate.KINDS), format_func=patching_translate.KINDS.get,
                    horizontal=True, key=key("kind"))
    asked = (model.info.key, clean, corrupted, kind)
    kept = st.session_state.get(key("result"))
    if st.button("Run patching", key=key("run")):
        try:
            pair = patching_translate.prepare(model, clean, corrupted, check=_check())
            result = patching_translate.patch_map(model, pair, kind, check=_check(), progress=_bar())
        except ValueError as err:
            st.error(plain(err))
            return
        st.session_state[key("result")] = kept = (asked, pair, result)
    if kept is None or kept[0] != asked:
        return
    _, pair, result = kept
    st.write(plain(f"Clean: {pair.clean_text!r}; corrupted: {pair.corrupted_text!r}. Scored after "
                   f"{''.join(pair.prefix)!r}: {pair.target_label!r} vs {pair.minus_label!r}, logit difference "
                   f"{pair.clean_diff:.4f} clean, {pair.corrupted_diff:.4f} corrupted."))
    title = f"recovered fraction: {patching_translate.KINDS[kind]}"
    st.plotly_chart(patching_figures.patch_heatmap(result.recovered, result.columns, title), key=key("map"))
    st.write(plain("Top: " + ", ".join(f"L{layer} {result.columns[c]} {v:.3f}" for layer, c, v in result.top(5))))
    st.download_button("Patching CSV", exports.csv_text(patching.patch_frame(result)), "translation_patching.csv",
                       "text/csv", key=key("csv"))
