"""The Lab page: attention step by step on a real head, positional encodings, variants inside a
pretrained model, toy transformers trained here, and a small text-reads-an-image model trained here. One view
is drawn and computed at a time (`ui.view_choice`); its heavy work runs on a button."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from attnviz.analysis import variant_fidelity
from attnviz.base import jobs, names
from attnviz.base.limits import LIMITS
from attnviz.base.timing import speed_words
from attnviz.base.texts import eval_text
from attnviz.figures import lab_figures
from attnviz.ui import common
from attnviz.ui import job_controls
from attnviz.ui import kept_inputs
from attnviz.ui import lab_experiments, lab_patterns, lab_positions, lab_reader, lab_steps, lab_toys, lab_translate
from attnviz.ui import lab_vit, shared_view

PAGE = "lab"
VARIANTS = ["temp:0.5", "temp:2", "local:4", "local:16", "linear", "relu", "topk:4", "topk:16"]


def key(name: str) -> str:
    """This page's session-state and widget keys: "lab.<name>"."""
    return names.session_key(PAGE, name)


# ---------------------------------------------------------------- 3. variants
def measure_variants(model, specs: list[str], layers: list[int], text: str) -> list:
    """Each variant in turn, under one heavy-job slot, a progress bar and the Lab's time limit
    (checked before every forward pass, with whether this browser session is still there). On a
    refusal or the limit: the message, and the rows measured so far."""
    rows, bar = [], st.progress(0.0, "measuring…")
    deadline = jobs.Deadline(LIMITS.max_lab_seconds, "the variants measurement")
    try:
        with job_controls.heavy_job("a variants measurement") as cancel:
            def check():
                deadline.check()
                cancel.check()

            for i, spec in enumerate(specs):
                bar.progress(i / len(specs), f"measuring {spec} ({i + 1} of {len(specs)})…")
                rows.append(variant_fidelity.variant_fidelity(model, text, {layer: spec for layer in layers},
                                                 label=spec, check=check))
    except jobs.JobTimeout as err:
        st.error(common.plain(f"{err}, after {len(rows)} of {len(specs)} variants. Choose fewer "
                          "variants or layers, or a shorter text."))
    except ValueError as err:
        st.error(common.plain(str(err)))
    finally:
        bar.empty()
    return rows


def fidelity_table(rows) -> pd.DataFrame:
    lm = rows[0].kl is not None
    return pd.DataFrame([dict(
        variant=r.label, **({"KL (nats/token)": r.kl, "top-1 agreement": r.top1,
                             "perplexity": r.perplexity, "reference perplexity": r.reference_perplexity}
                            if lm else {"sentence cosine": r.cosine, "token cosine": r.token_cosine}),
        **{"ms": 1000 * r.seconds, "reference ms": 1000 * r.reference_seconds, "speed-up": r.speedup})
        for r in rows])


def variants_view(model):
    if model is None:
        st.info("Pick a text model in the sidebar.")
        return
    ss = st.session_state
    with st.form(key("var_form")):
        specs = st.multiselect("Variants", default=["temp:2", "local:16", "linear", "relu", "topk:16"],
                               **shared_view.linked(key("var_specs"), options=VARIANTS, kind=list))
        layers = st.multiselect("In layers", default=list(range(model.cfg.n_layers)),
                                **shared_view.linked(key(f"var_layers_{model.info.key}"),
                                                     options=range(model.cfg.n_layers), kind=list))
        var_text = st.text_area("Text", eval_text()[:700], key=key("var_text"), height=120,
                                help=f"the first {LIMITS.lab_max_tokens} tokens are used", **kept_inputs.kept())
        measure = st.form_submit_button("Measure", key=key("var_go"))
    if measure:
        if not specs or not layers:
            st.warning("Choose at least one variant and one layer.")
        else:
            ss[key("var_rows")] = measure_variants(model, specs, layers, var_text)
    rows = ss.get(key("var_rows")) or []
    if not rows:
        st.caption(f"Measure runs the text through the model once per variant and timing run "
                   f"(at most {LIMITS.max_lab_seconds:g} s in all, one of the server's heavy jobs).")
        return
    st.info("Not fine-tuned: each variant is swapped into a model trained with softmax attention, "
            "so these numbers say how far its output drifts from the model's own, not how well the "
            "variant would do after training.")
    table = fidelity_table(rows)
    st.dataframe(table, hide_index=True)
    metric = "top-1 agreement" if rows[0].kl is not None else "sentence cosine"
    c1, c2 = st.columns(2)
    c1.plotly_chart(lab_figures.bars_figure(list(table["variant"]), table[metric], f"Fidelity: {metric}"),
                    key=key("var_fid"))
    c2.plotly_chart(lab_figures.bars_figure(list(table["variant"]), table["speed-up"],
                                   "Measured speed-up over fused softmax (>1 is faster)"),
                    key=key("var_speed"))
    st.caption(speed_caption(rows))


def speed_caption(rows) -> str:
    """What was measured, in words taken from the measured ratios (never a claim beside them)."""
    measured = ", ".join(f"{r.label} {r.speedup:.2f}× ({speed_words(r.speedup)})" for r in rows)
    return (f"Measured here against fused softmax: {measured}. Times are medians of runs alternated "
            "with the unchanged model on this machine. Most variants are computed through their "
            "explicit n × n form here, so at these lengths a gain is not expected; what they "
            "promise is memory and scaling at long lengths (see the Latency page).")


VIEWS = {"Step by step": lab_steps.steps_view, "Positional encodings": lab_positions.positions_view,
         "Variants in a pretrained model": variants_view, "Toy transformers": lab_toys.toys_view,
         "Toy translator": lab_translate.toy_translator_view,
         "Patches, padding, sparse patterns": lab_patterns.patterns_view,
         lab_reader.VIEW: lab_reader.reader_view, lab_vit.VIEW: lab_vit.vit_view,
         lab_experiments.VIEW: lab_experiments.experiments_view}


def page():
    """The whole Lab page below its title."""
    st.caption("Check each claim about attention on real weights, and on a model you train in a minute.")
    model = common.model_picker(tasks=("encoder", "lm"))
    VIEWS[common.view_choice(PAGE, list(VIEWS))](model)
    shared_view.share_bar(PAGE)   # last: the link has every value this run set
