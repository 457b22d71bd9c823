"""Lab: attention step by step on a real head, positional encodings, variants inside a pretrained
model, and toy transformers trained here in under a minute."""
import html
import uuid

import pandas as pd
import streamlit as st
import torch

from attnviz.base.limits import LIMITS
from attnviz.base import jobs
from attnviz.analysis import lab
from attnviz.toys import training as toy_training
from attnviz.toys import tasks as toys
from attnviz import ui
from attnviz.figures import attention as viz
from attnviz.figures import lab as lf
from attnviz.base.texts import eval_text

st.set_page_config(page_title="attnviz · Lab", layout="wide")
st.title("Lab")
st.caption("Check each claim about attention on real weights, and on a model you train in a minute.")
model = ui.model_picker(tasks=("encoder", "lm"))
tab_steps, tab_pos, tab_var, tab_toy, tab_cross = st.tabs(
    ["Step by step", "Positional encodings", "Variants in a pretrained model", "Toy transformers",
     "Cross-modal"])


@st.cache_resource(max_entries=LIMITS.trace_cache_entries, show_spinner=False)
def trace_states(_model, key: str, text: str, layer: int):
    """One layer's pattern and every block input, for at most LIMITS.lab_max_tokens tokens (the
    steps hold several n x n matrices). cache_resource: no copy per rerun; nothing mutates it."""
    ids, _ = _model.encode_text(text)
    return _model.trace(ids[: LIMITS.lab_max_tokens], states=True, layers=[layer]), len(ids)


@st.cache_resource(max_entries=2, show_spinner=False)
def positionless(_model, key: str):
    return lab.without_positions(_model)


@st.cache_data(max_entries=16, show_spinner=False)
def permutations(_model, key: str, text: str, seed: int):
    plain = lab.permutation_test(positionless(_model, key), text, seed=seed)
    return plain, lab.permutation_test(_model, text, order=plain.order)


@st.cache_resource(max_entries=8, show_spinner=False)
def shipped_toy(key: str):
    return toys.load_toy(key)


@st.cache_data(max_entries=64, show_spinner=False)
def toy_accuracy(_toy, key: str, off: tuple[str, ...]) -> float:
    mask = torch.ones(_toy.cfg.n_layers, _toy.cfg.n_heads)
    for name in off:  # "L1H3" -> layer 1, head 3
        layer, head = name[1:].split("H")
        mask[int(layer), int(head)] = 0
    return toys.evaluate(_toy, mask).exact


@st.cache_data(max_entries=64, show_spinner=False)
def toy_answer(_toy, key: str, prompt: str):
    return toys.complete(_toy, prompt)


@st.cache_data(max_entries=16, show_spinner=False)
def toy_report(_toy, key: str):
    """Accuracy, head scores and one example's attention (key names the toy: shipped or trained)."""
    return dict(score=toys.evaluate(_toy), heads=toys.head_scores(_toy), example=toys.example(_toy))


def clamp_choice(name: str, upper: int, what: str):
    """A number kept in session state may be out of range after a model change: say so, fix it."""
    value = st.session_state.get(name, 0)
    if value > upper:
        st.warning(ui.plain(f"{what} {value} is out of range for {model.info.key} (0..{upper}); "
                            f"showing {what} {upper}."))
        st.session_state[name] = upper


# ---------------------------------------------------------------- 1. step by step
with tab_steps:
    if model is None:
        st.info("Pick a text model in the sidebar.")
    else:
        cfg = model.cfg
        text = st.text_input("Sentence", "The animal didn't cross the street because it was too tired.",
                             key="lab_text")
        clamp_choice("lab_layer", cfg.n_layers - 1, "layer")
        clamp_choice("lab_head", cfg.n_heads - 1, "head")
        c1, c2, c3, c4 = st.columns(4)
        layer = c1.number_input("Layer", 0, cfg.n_layers - 1, key="lab_layer")
        head = c2.number_input("Head", 0, cfg.n_heads - 1, key="lab_head")
        temperature = c3.slider("Temperature", 0.1, 5.0, 1.0, 0.1, key="lab_temp",
                                help="divides the scaled scores: < 1 sharpens, > 1 flattens")
        causal = c4.toggle("Causal mask", cfg.causal, key=f"lab_causal_{cfg.causal}",
                           help="queries see only earlier tokens")
        try:
            tr, n_text = trace_states(model, model.info.key, text, int(layer))
            if n_text > tr.n:
                st.warning(f"The step-by-step view uses the first {tr.n} of the text's {n_text} tokens.")
            hidden = st.multiselect("Hide keys (mask them for every query)", range(tr.n), key="lab_hide",
                                    format_func=lambda i: f"{i}: {tr.tokens[i]}")
            result = lab.head_steps(model, tr, int(layer), int(head), temperature=temperature,
                                    causal=causal, hidden_keys=tuple(hidden))
        except ValueError as err:
            st.error(ui.plain(str(err)))
            result = None
        if result is not None:
            if result.changed:
                st.info(f"Temperature or mask changed: this pattern differs from the one the model "
                        f"captured by design (max |difference| {result.max_abs_diff:.3g}). Reset "
                        "temperature to 1 and the masks to verify the recomputation.")
            else:
                st.success(f"The recomputation equals the pattern the model captured: max |difference| "
                           f"= {result.max_abs_diff:.2g}. The heads' outputs add up to the attention "
                           f"output to {result.output_diff:.2g}.")
            kv = f" (reads K/V head {result.kv_head})" if cfg.group > 1 else ""
            st.markdown(f"**Layer {layer}, head {head}{kv}**, {tr.n} tokens, d_model {cfg.d_model}, "
                        f"d_head {cfg.d_head}.")
            st.dataframe(pd.DataFrame([dict(step=s.name, shape=" × ".join(map(str, s.shape)),
                                            rows=s.rows, columns=s.cols, note=s.note)
                                       for s in result.steps.values()]), hide_index=True)
            # one row per stage, so Q, K and V (and their weights) sit side by side
            for stage in (("input", "normed"), ("W_Q", "W_K", "W_V"), ("Q", "K", "V"), ("Q_rot", "K_rot"),
                          ("scores", "scaled"), ("mask", "masked"), ("softmax", "weighted"), ("W_O", "output")):
                present = [k for k in stage if k in result.steps]
                for col, k in zip(st.columns(len(stage)), present):
                    col.plotly_chart(lf.step_figure(result.steps[k], tr.tokens, causal), key=f"lab_step_{k}")

# ---------------------------------------------------------------- 2. positional encodings
with tab_pos:
    n_pos = st.slider("Positions shown", 8, 256, 64, 8, key="lab_npos")
    d_sin = st.select_slider("Sinusoidal width d", [16, 32, 64, 128, 256, 384], 128, key="lab_dsin")
    sin = lab.sinusoidal_table(n_pos, d_sin)
    sim_sin = lab.cosine_similarity(sin)
    curves = {"sinusoidal": lab.by_distance(sim_sin)}
    c1, c2 = st.columns(2)
    c1.plotly_chart(lf.table_figure(sin, "Sinusoidal: PE[p, 2i] = sin(p/10000^(2i/d)), PE[p, 2i+1] = cos(…)"),
                    key="lab_sin")
    c2.plotly_chart(lf.similarity_figure(sim_sin, "Sinusoidal: cosine similarity of positions"),
                    key="lab_sin_sim")
    table = lab.learned_table(model) if model is not None else None
    if table is not None:
        table = table[:n_pos]
        sim_learned = lab.cosine_similarity(table)
        curves[f"learned ({html.escape(model.info.key)})"] = lab.by_distance(sim_learned)
        c1, c2 = st.columns(2)
        c1.plotly_chart(lf.table_figure(table, f"Learned: {html.escape(model.info.key)}'s position table"), key="lab_learned")
        c2.plotly_chart(lf.similarity_figure(sim_learned, "Learned: cosine similarity of positions"),
                        key="lab_learned_sim")
    else:
        st.caption("The model in the sidebar has no learned position table (pick minilm to see one).")
    rotary = model is not None and model.cfg.positional == "rotary"
    d_rope, theta = (model.cfg.d_head, model.cfg.rope_theta) if rotary else (64, 1e5)
    rope_sim = lab.rope_similarity(n_pos, d_rope, theta)
    curves[f"rotary (d_head {d_rope}, θ {theta:g})"] = lab.by_distance(rope_sim)
    c1, c2 = st.columns(2)
    c1.plotly_chart(lf.table_figure(lab.rope_angles(n_pos, d_rope, theta),
                                    f"Rotary: angle of each pair (d_head {d_rope}, θ = {theta:g}"
                                    f"{', SmolLM2' if not rotary else ''})", x_title="pair"), key="lab_rope")
    c2.plotly_chart(lf.similarity_figure(rope_sim, "Rotary: q·k of one vector at positions i and j"),
                    key="lab_rope_sim")
    n_alibi = model.cfg.n_heads if model is not None else 8
    alibi = lab.alibi_table(n_pos, n_alibi)
    c1, c2 = st.columns(2)
    c1.plotly_chart(lf.matrix_figure(alibi[0], f"ALiBi: score bias of head 0 of {n_alibi} (−slope × distance)",
                                     row_title="query", col_title="key", height=420), key="lab_alibi")
    c2.plotly_chart(lf.distance_curves_figure({f"head {h}": alibi[h, -1].flip(0) for h in range(n_alibi)},
                                              "score bias", "ALiBi: bias against distance per head"),
                    key="lab_alibi_lines")
    st.plotly_chart(lf.distance_curves_figure(curves, "mean similarity",
                                              "Position-to-position similarity against distance"),
                    key="lab_curves")

    st.subheader("Without positions, shuffling the words only permutes the attention")
    if model is None:
        st.info("Pick a text model in the sidebar.")
    else:
        perm_text = st.text_input("Sentence to shuffle", "The cat chased the small mouse across the garden.",
                                  key="lab_perm_text")
        seed = st.number_input("Shuffle seed", 0, 999, 0, key="lab_perm_seed")
        try:
            plain, with_pos = permutations(model, model.info.key, perm_text, int(seed))
        except ValueError as err:
            st.error(ui.plain(str(err)))
            plain = None
        if plain is not None:
            shuffled_tokens = [plain.tokens[i] for i in plain.order]
            st.markdown(ui.plain("Shuffled: " + " ".join(shuffled_tokens)))
            m1, m2 = st.columns(2)
            m1.metric("Without positions: max |difference|", f"{plain.max_diff:.1e}")
            m2.metric(f"With {model.cfg.positional} positions: max |difference|", f"{with_pos.max_diff:.3f}")
            if plain.causal:
                st.warning("This model is causal: its mask itself tells positions apart, so even without "
                           "positional encodings shuffling changes the attention. Pick an encoder (minilm) "
                           "to see exact equivariance.")
            else:
                st.success("Without positions the shuffled sentence's attention is the original one with rows "
                           f"and columns permuted, to {plain.max_diff:.0e} (float64 rounding). The model "
                           "cannot tell word order; positional encodings are what tell it.")
            L, H = plain.attentions.shape[:2]
            pl, ph = st.columns(2)
            p_layer = pl.slider("Layer", 0, L - 1, 0, key="lab_perm_layer")
            p_head = ph.slider("Head", 0, H - 1, 0, key="lab_perm_head")
            idx = torch.tensor(plain.order)
            back = plain.shuffled[p_layer, p_head][torch.argsort(idx)][:, torch.argsort(idx)]
            c1, c2, c3 = st.columns(3)
            c1.plotly_chart(viz.head_heatmap(plain.attentions[p_layer, p_head].float(), plain.tokens,
                                             title="original order"), key="lab_perm_a")
            c2.plotly_chart(viz.head_heatmap(plain.shuffled[p_layer, p_head].float(), shuffled_tokens,
                                             title="shuffled"), key="lab_perm_b")
            c3.plotly_chart(viz.head_heatmap(back.float(), plain.tokens, title="shuffled, put back in order"),
                            key="lab_perm_c")

# ---------------------------------------------------------------- 3. variants
with tab_var:
    if model is None:
        st.info("Pick a text model in the sidebar.")
    else:
        L = model.cfg.n_layers
        with st.form("lab_var_form"):
            specs = st.multiselect("Variants", ["temp:0.5", "temp:2", "local:4", "local:16", "linear", "relu",
                                                "topk:4", "topk:16"],
                                   ["temp:2", "local:16", "linear", "relu", "topk:16"], key="lab_var_specs")
            layers = st.multiselect("In layers", list(range(L)), list(range(L)),
                                    key=f"lab_var_layers_{model.info.key}")
            var_text = st.text_area("Text", eval_text()[:700], key="lab_var_text", height=120)
            measure = st.form_submit_button("Measure", key="lab_var_go")
        if measure:
            if not specs or not layers:
                st.warning("Choose at least one variant and one layer.")
            else:
                rows, bar = [], st.progress(0.0, "measuring…")
                try:
                    for i, spec in enumerate(specs):
                        f = lab.variant_fidelity(model, var_text, {layer: spec for layer in layers}, label=spec)
                        rows.append(f)
                        bar.progress((i + 1) / len(specs), f"measured {spec}")
                except ValueError as err:
                    st.error(ui.plain(str(err)))
                st.session_state["lab_var_rows"] = rows
        rows = st.session_state.get("lab_var_rows") or []
        if rows:
            lm = rows[0].kl is not None
            table = pd.DataFrame([dict(
                variant=r.label, **({"KL (nats/token)": r.kl, "top-1 agreement": r.top1,
                                     "perplexity": r.perplexity, "reference perplexity": r.reference_perplexity}
                                    if lm else {"sentence cosine": r.cosine, "token cosine": r.token_cosine}),
                **{"ms": 1000 * r.seconds, "reference ms": 1000 * r.reference_seconds, "speed-up": r.speedup})
                for r in rows])
            st.dataframe(table, hide_index=True)
            metric = "top-1 agreement" if lm else "sentence cosine"
            c1, c2 = st.columns(2)
            c1.plotly_chart(lf.bars_figure(list(table["variant"]), table[metric], f"Fidelity: {metric}"),
                            key="lab_var_fid")
            c2.plotly_chart(lf.bars_figure(list(table["variant"]), table["speed-up"],
                                           "Measured speed-up over fused softmax (>1 is faster)"),
                            key="lab_var_speed")
            st.caption("Times are medians of runs alternated with the unchanged model on this machine. "
                       "The variants other than local and softmax are computed through their explicit "
                       "n × n form here, so they are not faster at these lengths; their gain is memory and "
                       "scaling (see the Latency page).")

# ---------------------------------------------------------------- 4. toy transformers
with tab_toy:
    st.markdown("Synthetic tasks with exact answers, learnt by our own modules: "
                + "; ".join(f"**{k}**: {v}" for k, v in toys.TASKS.items()) + ".")
    source = st.radio("Model", ["shipped checkpoint", "train one now"], horizontal=True, key="lab_toy_source")
    toy = None
    if source == "shipped checkpoint":
        if not toys.TOYS:
            st.error("No toy checkpoints are installed (attnviz/data/toys is empty); run scripts/train_toys.py.")
        else:
            key = st.selectbox("Checkpoint", list(toys.TOYS), key="lab_toy_key",
                               format_func=lambda k: f"{k} — stated exact accuracy "
                                                     f"{toys.TOYS[k]['accuracy']['exact']:.1%}")
            toy, toy_key = shipped_toy(key), key
    else:
        with st.form("lab_toy_form"):
            c1, c2, c3, c4 = st.columns(4)
            task_name = c1.selectbox("Task", list(toys.TASKS), key="lab_toy_task")
            length = c1.slider("Length", 2, 16, 8, key="lab_toy_len")
            heads = c2.select_slider("Heads", [2, 4, 8], 4, key="lab_toy_heads")
            n_layers = c2.slider("Layers", 1, 4, 2, key="lab_toy_layers")
            d_model = c3.select_slider("Width d_model", [32, 64, 128], 64, key="lab_toy_width")
            positional = c3.selectbox("Positions", list(toys.POSITIONALS), 0, key="lab_toy_pos")
            variant = c4.selectbox("Attention", ["softmax", "linear", "relu", "local:4", "topk:4"],
                                   key="lab_toy_var")
            steps = c4.number_input("Steps", 50, 5000, 600, 50, key="lab_toy_steps")
            ckpt = st.toggle("Gradient checkpointing (recompute block activations in backward)",
                             key="lab_toy_ckpt")
            train_go = st.form_submit_button("Train", key="lab_toy_train")
        try:
            settings = toy_training.TrainSettings(
                task=toys.Task(task_name, length, n_keys=max(16, length)), n_layers=n_layers, n_heads=heads,
                d_model=d_model, positional=positional, variant=variant, steps=int(steps), checkpoint=ckpt)
            st.caption(f"Estimated training time: {toy_training.estimate_seconds(settings):.0f} s "
                       f"(budget {LIMITS.max_train_seconds:.0f} s on two cores). Copy, reverse and sort learn in "
                       "a few hundred steps; recall needs about 1,000 (its induction heads form suddenly).")
            if train_go:
                toy_training.check_settings(settings)
                bar, chart, seen = st.progress(0.0, "training…"), st.empty(), []

                def report(step, total, loss):
                    seen.append(loss)
                    if step % 25 == 0 or step == total:  # redrawing every step would cost more than training
                        bar.progress(step / total, f"step {step}/{total}, loss {loss:.4f}")
                        chart.line_chart(pd.DataFrame({"loss": seen}), height=200)

                # one of the server's heavy-job slots (ServerBusy, a ValueError, at once if none is
                # free); the training itself stops at its time budget (LIMITS.max_train_seconds)
                with jobs.heavy_job("a toy training"):
                    res = toy_training.train(settings, report, eval_every=max(50, settings.steps // 10))
                    mem = toy_training.training_memory(settings)
                st.session_state["lab_toy_trained"] = (res, mem, f"trained:{uuid.uuid4().hex}")
        except ValueError as err:
            st.error(ui.plain(str(err)))
        trained = st.session_state.get("lab_toy_trained")
        if trained:
            res, mem, toy_key = trained
            toy = res.model
            msg = f"Trained {res.steps_done} steps in {res.seconds:.1f} s"
            (st.warning if res.stopped_early else st.success)(
                msg + (" — stopped at the time budget." if res.stopped_early else "."))
            st.plotly_chart(lf.loss_figure(res.losses, res.history), key="lab_toy_loss")
            st.caption(f"Peak training memory of one step, measured: {mem.step_peak / 1e6:.2f} MB of "
                       f"activations and gradients + {mem.resident / 1e6:.2f} MB parameters and optimizer "
                       f"state ({'with' if mem.checkpoint else 'without'} gradient checkpointing).")

    if toy is not None:
        report = toy_report(toy, toy_key)
        score = report["score"]
        c1, c2, c3 = st.columns(3)
        c1.metric("Exact accuracy (2,000 held-out prompts)", f"{score.exact:.1%}")
        c2.metric("Token accuracy", f"{score.token:.1%}")
        c3.metric("Parameters", f"{toy.num_params():,}")
        prompt = st.text_input("Try it: a prompt", toy.task.example_prompt(), key=f"lab_toy_prompt_{toy.task}")
        try:
            answer, truth = toy_answer(toy, toy_key, prompt)
            (st.success if answer == truth else st.error)(
                ui.plain(f"model: {' '.join(answer)} · exact answer: {' '.join(truth)}"))
        except ValueError as err:
            st.error(ui.plain(str(err)))

        scores = report["heads"]
        c1, c2 = st.columns(2)
        c1.plotly_chart(lf.head_grid_figure(scores["source"],
                                            "Weight on the answer's source (copy / induction heads)"),
                        key="lab_toy_src")
        c2.plotly_chart(lf.head_grid_figure(scores["previous"],
                                            "Weight on the previous token (previous-token heads)"),
                        key="lab_toy_prev")
        tokens, att = report["example"]
        names = [f"L{i}H{h}" for i in range(toy.cfg.n_layers) for h in range(toy.cfg.n_heads)]
        best, prev = int(scores["source"].argmax()), int(scores["previous"].argmax())
        c1, c2 = st.columns(2)
        shown = c1.selectbox("Head to show (default: the strongest source head)", range(len(names)), best,
                             format_func=lambda i: names[i], key=f"lab_toy_show_{toy_key}")
        c1.plotly_chart(viz.head_heatmap(att[divmod(shown, toy.cfg.n_heads)], tokens, causal=True,
                                         title=f"{names[shown]}: source weight "
                                               f"{scores['source'].flatten()[shown]:.2f}"),
                        key="lab_toy_best")
        c2.plotly_chart(viz.head_heatmap(att[divmod(prev, toy.cfg.n_heads)], tokens, causal=True,
                                         title=f"Strongest previous-token head {names[prev]}: weight on the "
                                               f"previous token {scores['previous'].flatten()[prev]:.2f}"),
                        key="lab_toy_prevmap")
        st.caption("Induction: a recall query looks at the value right after the earlier copy of its key; "
                   "copy and reverse heads look at the digit the answer repeats; a previous-token head puts "
                   "each position's weight on the one before it (the stripe under the diagonal).")

        st.subheader("Switch heads off")
        off = st.multiselect("Heads off", names, key=f"lab_toy_off_{toy.info.key}_{toy.cfg.n_heads}")
        masked = toy_accuracy(toy, toy_key, tuple(sorted(off)))
        st.metric("Exact accuracy with these heads off", f"{masked:.1%}", delta=f"{masked - score.exact:+.1%}")
        curves = st.session_state.setdefault("lab_toy_curves", {})  # results outlive the click
        if st.button("Pruning curve (switch heads off one by one)", key="lab_toy_prune"):
            with st.spinner("evaluating every head…"):
                curves[toy_key] = toys.pruning_curve(toy)
        if toy_key in curves:
            st.plotly_chart(lf.pruning_figure(curves[toy_key]), key="lab_toy_curve")

    st.subheader("4 vs 8 heads, and gradient checkpointing")
    pair = [k for k in toys.TOYS if toys.TOYS[k].get("compare")]
    if len(pair) >= 2 and st.button("Compare the shipped 4- and 8-head models", key="lab_toy_cmp"):
        rows = []
        for k in pair:
            m = shipped_toy(k)
            rows.append({"model": k, "heads": m.cfg.n_heads, "d_head": m.cfg.d_head,
                         "exact accuracy": toys.evaluate(m).exact, "parameters": m.num_params(),
                         "ms (1 prompt)": 1000 * toy_training.latency(m, 1),
                         "ms (256 prompts)": 1000 * toy_training.latency(m, 256, repeats=10)})
        st.session_state["lab_toy_cmp_rows"] = rows
    if "lab_toy_cmp_rows" in st.session_state:
        st.dataframe(pd.DataFrame(st.session_state["lab_toy_cmp_rows"]), hide_index=True)
        st.caption("Same width (d_model) split into 4 or 8 heads: the same parameters, smaller heads, "
                   "more of them to run; times measured on this machine when you clicked.")
    if st.button("Measure peak training memory with and without checkpointing", key="lab_toy_mem"):
        s = toy_training.TrainSettings(task=toys.Task("copy", 16), n_layers=4, d_model=128, batch_size=64)
        try:
            with jobs.heavy_job("a training-memory measurement"):
                st.session_state["lab_toy_mem_reports"] = [toy_training.training_memory(s, c)
                                                           for c in (False, True)]
        except ValueError as err:
            st.error(ui.plain(str(err)))
    if "lab_toy_mem_reports" in st.session_state:
        reports = st.session_state["lab_toy_mem_reports"]
        st.plotly_chart(lf.bars_figure(["without checkpointing", "with checkpointing"],
                                       [r.step_peak / 1e6 for r in reports],
                                       "Peak memory of one training step (MB, measured)", "MB", ".2f"),
                        key="lab_toy_membars")
        st.caption(f"4 layers × d_model 128, batch 64, 33 tokens. Parameters and optimizer state add "
                   f"{reports[0].resident / 1e6:.2f} MB either way. Checkpointing keeps only each block's "
                   "input and recomputes the rest during backward: less memory, more compute.")

# ---------------------------------------------------------------- 5. cross-modal
with tab_cross:
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
