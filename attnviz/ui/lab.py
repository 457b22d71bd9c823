"""The Lab page: attention step by step on a real head, positional encodings, variants inside a
pretrained model, toy transformers trained here, and why there is no cross-modal view. One view
is drawn and computed at a time (`ui.view_choice`); its heavy work runs on a button."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from attnviz.analysis import lab
from attnviz.base import jobs, names
from attnviz.base.limits import LIMITS
from attnviz.base.texts import eval_text
from attnviz.figures import lab as lf
from attnviz.ui import common as ui
from attnviz.ui import jobs as ui_jobs
from attnviz.ui import lab_patterns, lab_positions, lab_toys, lab_translate

PAGE = "lab"
SENTENCE = "The animal didn't cross the street because it was too tired."
VARIANTS = ["temp:0.5", "temp:2", "local:4", "local:16", "linear", "relu", "topk:4", "topk:16"]


def key(name: str) -> str:
    """This page's session-state and widget keys: "lab.<name>"."""
    return names.session_key(PAGE, name)


def model_id(model) -> str:
    return f"{model.info.key}@{id(model)}"


def clamp_choice(model, name: str, upper: int, what: str):
    """A number kept in session state may be out of range after a model change: say so, fix it."""
    value = st.session_state.get(name, 0)
    if value > upper:
        st.warning(ui.plain(f"{what} {value} is out of range for {model.info.key} (0..{upper}); "
                            f"showing {what} {upper}."))
        st.session_state[name] = upper


def encoded(model, text: str):
    """Token ids of ``text`` and their number, tokenized once per model and text (a rerun for a
    slider, a head or a mask does not tokenize again)."""
    store = ui.shared_cache("lab.ids", 32, 64)
    return ui.cached(store, (model_id(model), text), lambda: model.encode_text(text)[0])


def trace_states(model, text: str, layer: int):
    """One layer's pattern and every block input, for at most LIMITS.lab_max_tokens tokens (the
    steps hold several n x n matrices); shared by sessions, bounded in bytes; nothing mutates it."""
    ids = encoded(model, text)
    store = ui.shared_cache("lab.states", LIMITS.trace_cache_entries, LIMITS.result_cache_mb)
    return ui.cached(store, (model_id(model), text, layer), lambda: model.trace(
        ids[: LIMITS.lab_max_tokens], states=True, layers=[layer])), len(ids)


# ---------------------------------------------------------------- 1. step by step
STAGES = (("input", "normed"), ("W_Q", "W_K", "W_V"), ("Q", "K", "V"), ("Q_rot", "K_rot"),
          ("scores", "scaled"), ("mask", "masked"), ("softmax", "weighted"), ("W_O", "output"))


def steps_view(model):
    if model is None:
        st.info("Pick a text model in the sidebar.")
        return
    cfg = model.cfg
    text = st.text_input("Sentence", SENTENCE, key=key("text"))
    clamp_choice(model, key("layer"), cfg.n_layers - 1, "layer")
    clamp_choice(model, key("head"), cfg.n_heads - 1, "head")
    c1, c2, c3, c4 = st.columns(4)
    layer = c1.number_input("Layer", 0, cfg.n_layers - 1, key=key("layer"))
    head = c2.number_input("Head", 0, cfg.n_heads - 1, key=key("head"))
    temperature = c3.slider("Temperature", 0.1, 5.0, 1.0, 0.1, key=key("temp"),
                            help="divides the scaled scores: < 1 sharpens, > 1 flattens")
    causal = c4.toggle("Causal mask", cfg.causal, key=key(f"causal_{cfg.causal}"),
                       help="queries see only earlier tokens")
    try:
        tr, n_text = trace_states(model, text, int(layer))
        if n_text > tr.n:
            st.warning(f"The step-by-step view uses the first {tr.n} of the text's {n_text} tokens.")
        hidden = st.multiselect("Hide keys (mask them for every query)", range(tr.n), key=key("hide"),
                                format_func=lambda i: f"{i}: {tr.tokens[i]}")
        result = lab.head_steps(model, tr, int(layer), int(head), temperature=temperature,
                                causal=causal, hidden_keys=tuple(hidden))
    except ValueError as err:
        st.error(ui.plain(str(err)))
        return
    if result.changed:
        st.info(f"Temperature or mask changed: this pattern differs from the one the model "
                f"captured by design (max |difference| {result.max_abs_diff:.3g}). Reset "
                "temperature to 1 and the masks to verify the recomputation.")
    else:
        st.success(f"The recomputation equals the pattern the model captured: max |difference| "
                   f"= {result.max_abs_diff:.2g}. The heads' outputs add up to the attention "
                   f"output to {result.output_diff:.2g}.")
    kv = f" (reads K/V head {result.kv_head})" if cfg.group > 1 else ""
    st.markdown(f"**{names.head_name(layer, head)}: layer {layer}, head {head}{kv}**, {tr.n} tokens, "
                f"d_model {cfg.d_model}, d_head {cfg.d_head}.")
    st.dataframe(pd.DataFrame([dict(step=s.name, shape=" × ".join(map(str, s.shape)),
                                    rows=s.rows, columns=s.cols, note=s.note)
                               for s in result.steps.values()]), hide_index=True)
    # one row per stage, so Q, K and V (and their weights) sit side by side
    for stage in STAGES:
        present = [k for k in stage if k in result.steps]
        for col, k in zip(st.columns(len(stage)), present):
            col.plotly_chart(lf.step_figure(result.steps[k], tr.tokens, causal), key=key(f"step_{k}"))


# ---------------------------------------------------------------- 3. variants
def measure_variants(model, specs: list[str], layers: list[int], text: str) -> list:
    """Each variant in turn, under one heavy-job slot, a progress bar and the Lab's time limit
    (checked before every forward pass, with whether this browser session is still there). On a
    refusal or the limit: the message, and the rows measured so far."""
    rows, bar = [], st.progress(0.0, "measuring…")
    deadline = jobs.Deadline(LIMITS.max_lab_seconds, "the variants measurement")
    try:
        with ui_jobs.heavy_job("a variants measurement") as cancel:
            def check():
                deadline.check()
                cancel.check()

            for i, spec in enumerate(specs):
                bar.progress(i / len(specs), f"measuring {spec} ({i + 1} of {len(specs)})…")
                rows.append(lab.variant_fidelity(model, text, {layer: spec for layer in layers},
                                                 label=spec, check=check))
    except jobs.JobTimeout as err:
        st.error(ui.plain(f"{err}, after {len(rows)} of {len(specs)} variants. Choose fewer "
                          "variants or layers, or a shorter text."))
    except ValueError as err:
        st.error(ui.plain(str(err)))
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
        specs = st.multiselect("Variants", VARIANTS, ["temp:2", "local:16", "linear", "relu", "topk:16"],
                               key=key("var_specs"))
        layers = st.multiselect("In layers", list(range(model.cfg.n_layers)),
                                list(range(model.cfg.n_layers)), key=key(f"var_layers_{model.info.key}"))
        var_text = st.text_area("Text", eval_text()[:700], key=key("var_text"), height=120,
                                help=f"the first {LIMITS.lab_max_tokens} tokens are used")
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
    c1.plotly_chart(lf.bars_figure(list(table["variant"]), table[metric], f"Fidelity: {metric}"),
                    key=key("var_fid"))
    c2.plotly_chart(lf.bars_figure(list(table["variant"]), table["speed-up"],
                                   "Measured speed-up over fused softmax (>1 is faster)"),
                    key=key("var_speed"))
    st.caption(speed_caption(rows))


def speed_words(ratio: float) -> str:
    """How a measured speed-up reads: within 5 % either way is "about as fast" (timing noise)."""
    if ratio > 1.05:
        return "faster"
    return "slower" if ratio < 0.95 else "about as fast"


def speed_caption(rows) -> str:
    """What was measured, in words taken from the measured ratios (never a claim beside them)."""
    measured = ", ".join(f"{r.label} {r.speedup:.2f}× ({speed_words(r.speedup)})" for r in rows)
    return (f"Measured here against fused softmax: {measured}. Times are medians of runs alternated "
            "with the unchanged model on this machine. Most variants are computed through their "
            "explicit n × n form here, so at these lengths a gain is not expected; what they "
            "promise is memory and scaling at long lengths (see the Latency page).")


# ---------------------------------------------------------------- 5. cross-modal
def cross_view(model):
    st.markdown("""
**Cross-modal attention (text queries over image patches) is not built here, on purpose.**
Attention from words to patches only means something when text and image features live in one
space: CLIP-style models learn that from hundreds of millions of captioned images. What installs
here is MiniLM (text only) and DINOv2 (image only), whose features were never aligned, and no
captioned image set: a cross-attention layer trained in the lab on the handful of sample photos
would fit those few pictures and its maps would show what it memorised, not where a word is.
A page that drew such maps would teach the wrong lesson, so the lab leaves it out; a model that
aligns text and images (CLIP-style) would make it the natural next step.
""")


VIEWS = {"Step by step": steps_view, "Positional encodings": lab_positions.positions_view,
         "Variants in a pretrained model": variants_view, "Toy transformers": lab_toys.toys_view,
         "Toy translator": lab_translate.toy_translator_view,
         "Patches, padding, sparse patterns": lab_patterns.patterns_view, "Cross-modal": cross_view}


def page():
    """The whole Lab page below its title."""
    st.caption("Check each claim about attention on real weights, and on a model you train in a minute.")
    model = ui.model_picker(tasks=("encoder", "lm"))
    VIEWS[ui.view_choice(PAGE, list(VIEWS))](model)
