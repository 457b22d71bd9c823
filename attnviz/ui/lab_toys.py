"""The Lab's toy-transformer view: a shipped checkpoint or one trained now (a heavy job), its
accuracy, head scores and attention, heads switched off in the shared head editor, a pruning
curve, 4 vs 8 heads and the memory of gradient checkpointing."""
from __future__ import annotations

import time

import uuid

import pandas as pd
import streamlit as st
import torch

from attnviz.base import names
from attnviz.base.limits import LIMITS
from attnviz.figures import attention_figures
from attnviz.figures import lab_figures
from attnviz.toys import tasks
from attnviz.toys import training
from attnviz.ui import common
from attnviz.ui import job_controls
from attnviz.ui.head_editor import head_editor, metric_delta
from attnviz.ui import shared_view

PAGE = "lab"
EDITOR = "toys"   # the head editor's namespace: "toys.row:<toy>:<layer>", "toys.apply", ...


def key(name: str) -> str:
    return names.session_key(PAGE, name)


@st.cache_resource(max_entries=8, show_spinner=False)
def shipped_toy(toy_key: str):
    return tasks.load_toy(toy_key)


@st.cache_data(max_entries=64, show_spinner=False)
def toy_accuracy(_toy, toy_key: str, off: tuple[str, ...]) -> float:
    mask = torch.ones(_toy.cfg.n_layers, _toy.cfg.n_heads)
    for name in off:
        mask[names.parse_head_name(name)] = 0
    return tasks.evaluate(_toy, mask).exact


@st.cache_data(max_entries=64, show_spinner=False)
def toy_answer(_toy, toy_key: str, prompt: str):
    return tasks.complete(_toy, prompt)


@st.cache_data(max_entries=16, show_spinner=False)
def toy_report(_toy, toy_key: str):
    """Accuracy, head scores and one example's attention (toy_key names the toy: shipped or trained)."""
    return dict(score=tasks.evaluate(_toy), heads=tasks.head_scores(_toy), example=tasks.example(_toy))


def off_heads(keep: torch.Tensor) -> tuple[str, ...]:
    """The names of the heads a mask [L, H] switches off, in order ("L1H3", ...)."""
    return tuple(names.head_name(i, h) for i, h in (keep == 0).nonzero().tolist())


def settings_words(s: training.TrainSettings) -> str:
    """What a toy is trained with, in the words of the form."""
    return (f"{s.task.name}, length {s.task.length}, {s.n_layers} layers × {s.n_heads} heads, d_model "
            f"{s.d_model}, {s.positional} positions, {s.variant} attention, {s.steps} steps"
            + (", gradient checkpointing" if s.checkpoint else ""))


def train_form():
    """Train a toy now; returns (toy, key) of the last trained one, or (None, None). What is shown
    below the form says what it was trained with, and when the form has changed since."""
    ss = st.session_state
    settings = None
    with st.form(key("toy_form")):
        c1, c2, c3, c4 = st.columns(4)
        task_name = c1.selectbox("Task", **shared_view.linked(key("toy_task"), options=tasks.TASKS))
        length = c1.slider("Length", value=8, **shared_view.linked(key("toy_len"), bounds=(2, 16)))
        heads = c2.select_slider("Heads", value=4, **shared_view.linked(key("toy_heads"), options=[2, 4, 8]))
        n_layers = c2.slider("Layers", value=2, **shared_view.linked(key("toy_layers"), bounds=(1, 4)))
        d_model = c3.select_slider("Width d_model", value=64, **shared_view.linked(key("toy_width"), options=[32, 64, 128]))
        positional = c3.selectbox("Positions", index=0, **shared_view.linked(key("toy_pos"), options=tasks.POSITIONALS))
        variant = c4.selectbox("Attention",
                               **shared_view.linked(key("toy_var"), options=["softmax", "linear", "relu", "local:4", "topk:4"]))
        steps = c4.number_input("Steps", value=600, step=50, **shared_view.linked(key("toy_steps"), bounds=(50, 5000)))
        ckpt = st.toggle("Gradient checkpointing (recompute block activations in backward)",
                         **shared_view.linked(key("toy_ckpt"), kind=bool))
        train_go = st.form_submit_button("Train", key=key("toy_train"))
    try:
        settings = training.TrainSettings(
            task=tasks.Task(task_name, length, n_keys=max(16, length)), n_layers=n_layers, n_heads=heads,
            d_model=d_model, positional=positional, variant=variant, steps=int(steps), checkpoint=ckpt)
        st.caption(f"Rough guess for an idle machine: {training.estimate_seconds(settings):.0f} s; Train times a few "
                   f"steps here first and refuses what would not fit the budget ({LIMITS.max_train_seconds:.0f} s). "
                   "Copy, reverse and sort "
                   "learn in a few hundred steps; recall needs about 1,000 (its induction heads form "
                   "suddenly).")
        if train_go:
            training.check_settings(settings)
            every = max(50, settings.steps // 10)
            with st.spinner("Timing a few training steps on this machine…"):
                guess = training.timed_estimate(settings, every)
            if guess > settings.budget_s:  # timed here, so a busy machine is refused before, not cut after
                fit = max(1, int(settings.steps * settings.budget_s / guess))
                raise ValueError(f"timed on this machine now, {settings.steps} steps would take about {guess:.0f} s, "
                                 f"over the {settings.budget_s:.0f} s budget: use at most {fit} steps, or fewer "
                                 "layers, a smaller width or batch")
            started = time.perf_counter()
            # the live progress bar and loss chart sit in one placeholder, emptied when training
            # ends however it ends: the result below replaces them (no stale bar left on screen)
            live = st.empty()
            with live.container():
                bar, chart, seen = st.progress(0.0, f"training… about {guess:.0f} s (timed here)"), st.empty(), []

            def report(step, total, loss):
                seen.append(loss)
                if step % 25 == 0 or step == total:  # redrawing every step would cost more than training
                    left = (time.perf_counter() - started) / step * (total - step)  # at this run's own pace
                    bar.progress(step / total, f"step {step}/{total}, loss {loss:.4f} · about {left:.0f} s left")
                    chart.line_chart(pd.DataFrame({"loss": seen}), height=200)

            # one of the server's heavy-job slots (ServerBusy, a ValueError, at once if none is
            # free); the training itself stops at its time budget (LIMITS.max_train_seconds)
            # and stops between steps when this browser session goes away
            try:
                with job_controls.heavy_job("a toy training") as cancel:
                    res = training.train(settings, report, eval_every=every,
                                             should_stop=cancel)
                    mem = training.training_memory(settings, check=cancel.check)
            finally:
                live.empty()
            ss[key("toy_trained")] = (res, mem, f"trained:{uuid.uuid4().hex}")
            ss[key("toy_trained_with")] = settings_words(settings)
    except ValueError as err:
        st.error(common.plain(str(err)))
    trained = ss.get(key("toy_trained"))
    if not trained:
        return None, None
    res, mem, toy_key = trained
    trained_with = ss.get(key("toy_trained_with"), "")
    if settings is not None and trained_with != settings_words(settings):
        st.info(common.plain(f"The form has changed since the toy below was trained: it is still the toy "
                             f"trained with {trained_with}. Press Train to train one with the form's settings."))
    msg = f"Trained {res.steps_done} steps in {res.seconds:.1f} s"
    (st.warning if res.stopped_early else st.success)(
        msg + (" — stopped at the time budget." if res.stopped_early else ".")
        + (f" Trained with: {common.plain(trained_with)}." if trained_with else ""))
    st.plotly_chart(lab_figures.loss_figure(res.losses, res.history), key=key("toy_loss"))
    st.caption(f"Peak training memory of one step, measured: {mem.step_peak / 1e6:.2f} MB of "
               f"activations and gradients + {mem.resident / 1e6:.2f} MB parameters and optimizer "
               f"state ({'with' if mem.checkpoint else 'without'} gradient checkpointing).")
    return res.model, toy_key


def heads_off(toy, toy_key: str, source: torch.Tensor, exact: float):
    """The shared head editor, its effect beside it: exact accuracy with the applied heads off."""
    st.subheader("Switch heads off")

    def effect(keep: torch.Tensor):
        masked = toy_accuracy(toy, toy_key, off_heads(keep))
        return lambda: st.metric("Exact accuracy with these heads off", f"{masked:.1%}",
                                 **metric_delta(masked - exact, f"{masked - exact:+.1%}", "higher", 3))

    head_editor(toy.cfg, EDITOR, scores=source, model_key=toy_key, effect=effect,
                score_label="weight on the answer's source")
    curves = st.session_state.setdefault(key("toy_curves"), {})  # results outlive the click
    if st.button("Pruning curve (switch heads off one by one)", key=key("toy_prune")):
        with st.spinner("evaluating every head…"):
            curves[toy_key] = tasks.pruning_curve(toy)
    if toy_key in curves:
        st.plotly_chart(lab_figures.pruning_figure(curves[toy_key]), key=key("toy_curve"))


def toy_details(toy, toy_key: str):
    report = toy_report(toy, toy_key)
    score = report["score"]
    c1, c2, c3 = st.columns(3)
    c1.metric("Exact accuracy (2,000 held-out prompts)", f"{score.exact:.1%}")
    c2.metric("Token accuracy", f"{score.token:.1%}")
    c3.metric("Parameters", f"{toy.num_params():,}")
    prompt = st.text_input("Try it: a prompt", toy.task.example_prompt(), **shared_view.linked(key(f"toy_prompt_{toy.task}"), kind=str))
    try:
        answer, truth = toy_answer(toy, toy_key, prompt)
        (st.success if answer == truth else st.error)(
            common.plain(f"model: {' '.join(answer)} · exact answer: {' '.join(truth)}"))
    except ValueError as err:
        st.error(common.plain(str(err)))
    scores = report["heads"]
    c1, c2 = st.columns(2)
    c1.plotly_chart(lab_figures.head_grid_figure(scores["source"],
                                        "Weight on the answer's source (copy / induction heads)"),
                    key=key("toy_src"))
    c2.plotly_chart(lab_figures.head_grid_figure(scores["previous"],
                                        "Weight on the previous token (previous-token heads)"),
                    key=key("toy_prev"))
    tokens, att = report["example"]
    all_heads = names.head_names(toy.cfg.n_layers, toy.cfg.n_heads)
    best, prev = int(scores["source"].argmax()), int(scores["previous"].argmax())
    c1, c2 = st.columns(2)
    shown = c1.selectbox("Head to show (default: the strongest source head)", range(len(all_heads)), best,
                         format_func=lambda i: all_heads[i], key=key(f"toy_show_{toy_key}"))
    c1.plotly_chart(attention_figures.head_heatmap(att[divmod(shown, toy.cfg.n_heads)], tokens, causal=True,
                                     title=f"{all_heads[shown]}: source weight "
                                           f"{scores['source'].flatten()[shown]:.2f}"),
                    key=key("toy_best"))
    c2.plotly_chart(attention_figures.head_heatmap(att[divmod(prev, toy.cfg.n_heads)], tokens, causal=True,
                                     title=f"Strongest previous-token head {all_heads[prev]}: weight "
                                           f"on the previous token {scores['previous'].flatten()[prev]:.2f}"),
                    key=key("toy_prevmap"))
    st.caption("Induction: a recall query looks at the value right after the earlier copy of its key; "
               "copy and reverse heads look at the digit the answer repeats; a previous-token head puts "
               "each position's weight on the one before it (the stripe under the diagonal).")
    heads_off(toy, toy_key, torch.as_tensor(scores["source"]).float(), score.exact)


def compare_and_memory():
    ss = st.session_state
    st.subheader("4 vs 8 heads, and gradient checkpointing")
    pair = [k for k in tasks.TOYS if tasks.TOYS[k].get("compare")]
    if len(pair) >= 2 and st.button("Compare the shipped 4- and 8-head models", key=key("toy_cmp")):
        rows = []
        for k in pair:
            m = shipped_toy(k)
            rows.append({"model": k, "heads": m.cfg.n_heads, "d_head": m.cfg.d_head,
                         "exact accuracy": tasks.evaluate(m).exact, "parameters": m.num_params(),
                         "ms (1 prompt)": 1000 * training.latency(m, 1),
                         "ms (256 prompts)": 1000 * training.latency(m, 256, repeats=10)})
        ss[key("toy_cmp_rows")] = rows
    if key("toy_cmp_rows") in ss:
        st.dataframe(pd.DataFrame(ss[key("toy_cmp_rows")]), hide_index=True, column_config={
            "exact accuracy": st.column_config.NumberColumn(format="percent")})   # 1 reads 100 %
        st.caption("Same width (d_model) split into 4 or 8 heads: the same parameters, smaller heads, "
                   "more of them to run; times measured on this machine when you clicked.")
    if st.button("Measure peak training memory with and without checkpointing", key=key("toy_mem")):
        s = training.TrainSettings(task=tasks.Task("copy", 16), n_layers=4, d_model=128, batch_size=64)
        try:
            with job_controls.heavy_job("a training-memory measurement") as cancel:
                ss[key("toy_mem_reports")] = [training.training_memory(s, c, check=cancel.check)
                                              for c in (False, True)]
        except ValueError as err:
            st.error(common.plain(str(err)))
    if key("toy_mem_reports") in ss:
        reports = ss[key("toy_mem_reports")]
        st.plotly_chart(lab_figures.bars_figure(["without checkpointing", "with checkpointing"],
                                       [r.step_peak / 1e6 for r in reports],
                                       "Peak memory of one training step (MB, measured)", "MB", ".2f"),
                        key=key("toy_membars"))
        st.caption(f"4 layers × d_model 128, batch 64, 33 tokens. Parameters and optimizer state add "
                   f"{reports[0].resident / 1e6:.2f} MB either way. Checkpointing keeps only each block's "
                   "input and recomputes the rest during backward: less memory, more compute.")


def toys_view(model):
    """`model` (the sidebar's) is not used: the toys are their own models."""
    st.markdown("Synthetic tasks with exact answers, learnt by our own modules: "
                + "; ".join(f"**{k}**: {v}" for k, v in tasks.TASKS.items()) + ".")
    source = st.radio("Model", horizontal=True,
                      **shared_view.linked(key("toy_source"), options=["shipped checkpoint", "train one now"]))
    toy, toy_key = None, None
    if source == "shipped checkpoint":
        if not tasks.TOYS:
            st.error("No toy checkpoints are installed (attnviz/data/toys is empty); run "
                     "scripts/train_toys.py.")
        else:
            toy_key = st.selectbox("Checkpoint", **shared_view.linked(
                key("toy_key"), format_func=lambda k: f"{k} — stated exact accuracy "
                                                      f"{tasks.TOYS[k]['accuracy']['exact']:.1%}", options=tasks.TOYS))
            toy = shipped_toy(toy_key)
    else:
        toy, toy_key = train_form()
    if toy is not None:
        toy_details(toy, toy_key)
    compare_and_memory()
