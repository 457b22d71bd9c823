"""The Lab's training-time experiments on a toy transformer (`attnviz.toys.training_experiments`):
dropout, temperature, the head-variance regulariser, dynamic head pruning, a shared key
projection, each against the baseline at the same seed; and two head measures, gradient
concentration and attention collapse, on the toy and on the sidebar's model when it is MiniLM or
SmolLM2 (over the evaluation text, cut to a token limit). Every figure comes with a sentence
built from its own numbers."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from attnviz.analysis import gradient_heads
from attnviz.base import exports, jobs, names
from attnviz.base.limits import LIMITS
from attnviz.figures import experiment_figures
from attnviz.toys import head_measures, training_experiments
from attnviz.ui import common, job_controls, shared_view

PAGE = "lab"
VIEW = "Training-time experiments"   # its name among the Lab's views
PRETRAINED = ("minilm", "smollm2")   # the bundled models the pretrained measure runs on
MEASURES = {"gradient": "gradient concentration over heads (“30 % of heads carry 90 % of the gradient”)",
            "collapse": "attention collapse (heads that attend only to themselves)"}
CHOICES = {**{k: v for k, v in training_experiments.EXPERIMENTS.items() if k != "baseline"}, **MEASURES}


def key(name: str) -> str:
    return names.session_key(PAGE, f"exp_{name}")


def pretrained_of(model):
    """The sidebar's model when the pretrained measure runs on it, else None."""
    return model if model is not None and model.info.key in PRETRAINED else None


def run_choice(choice: str, steps: int, seed: int, model) -> None:
    """The baseline and the chosen experiment (each trained once per steps and seed in this
    session) and, for a measure, the pretrained model's: under one heavy-job slot, a progress bar,
    the Lab's time limit and this session's Cancel. On a refusal or the limit: the message, and
    whatever finished stays."""
    ss = st.session_state
    runs, measured = ss.setdefault(key("runs"), {}), ss.setdefault(key("pretrained"), {})
    todo = [name for name in ("baseline", choice) if name in training_experiments.EXPERIMENTS
            and (name, steps, seed) not in runs]
    bar = st.progress(0.0, "starting…")
    deadline = jobs.Deadline(LIMITS.max_lab_seconds, "the experiment")
    try:
        with job_controls.heavy_job("a training-time experiment") as cancel:
            def stop() -> bool:
                deadline.check()
                return cancel()

            for i, name in enumerate(todo):
                def progress(step, total, loss, i=i, name=name):
                    if step % 10 == 0 or step == total:
                        bar.progress((i + step / total) / (len(todo) + 1),
                                     f"{training_experiments.EXPERIMENTS[name]}: step {step}/{total}, loss {loss:.3f}")

                runs[(name, steps, seed)] = training_experiments.run(name, steps, seed, progress, stop)
            pretrained = pretrained_of(model)
            if choice in MEASURES and pretrained is not None and pretrained.info.key not in measured:
                bar.progress(len(todo) / (len(todo) + 1), f"measuring {pretrained.info.key} on the evaluation text…")
                seconds = min(max(deadline.remaining, 0.001), LIMITS.max_importance_seconds)
                measured[pretrained.info.key] = gradient_heads.pretrained_heads(
                    pretrained, gradient_heads.MAX_TOKENS, seconds, should_stop=cancel)
        ss[key("shown")] = (choice, steps, seed)
    except jobs.JobTimeout as err:
        st.error(common.plain(f"{err}. Choose fewer steps."))
    except ValueError as err:
        st.error(common.plain(str(err)))
    finally:
        bar.empty()


def table(runs: dict, measured: dict) -> pd.DataFrame:
    """Every result of this session, one row per run (the CSV download)."""
    rows = [dict(model="toy", experiment=r.label, seed=r.seed, steps=r.steps, exact_accuracy=r.exact,
                 token_accuracy=r.token, parameters=r.params, heads_carrying_90pct=r.concentration.needed,
                 heads=r.concentration.heads, share_of_heads=r.concentration.share,
                 collapsed_heads=r.collapse.count, max_diagonal_mass=r.collapse.most()[1],
                 regulariser_last=r.penalties[-1] if r.penalties else None,
                 pruned=" ".join(f"{h}@{s}" for h, s in r.pruned.items()))
            for (_, _, _), r in sorted(runs.items())]
    rows += [dict(model=m.model_key, experiment="pretrained, evaluation text", steps=None,
                  heads_carrying_90pct=m.concentration.needed, heads=m.concentration.heads,
                  share_of_heads=m.concentration.share, collapsed_heads=m.collapse.count,
                  max_diagonal_mass=m.collapse.most()[1]) for m in measured.values()]
    return pd.DataFrame(rows)


def show_training(result, base) -> None:
    runs = {base.label: (base.losses, base.history), result.label: (result.losses, result.history)}
    finals = {r.label: (len(r.losses), r.exact) for r in (base, result)}   # what the sentence below quotes
    st.plotly_chart(experiment_figures.curves_figure(runs, finals), key=key("curves"))
    st.info(common.plain(training_experiments.verdict(result, base)))
    st.caption("One seed is one draw of the initialisation and the batches: change the seed to see how "
               "far the baseline itself moves before trusting a difference of a few points.")


def show_measure(choice: str, base, model, measured: dict) -> None:
    pretrained = pretrained_of(model)
    other = measured.get(pretrained.info.key) if pretrained is not None else None
    toy = f"toy ({training_experiments.SETTINGS.task.name}, seed {base.seed}, {base.steps} steps)"
    if choice == "gradient":
        labels, shares = [toy], [base.concentration.share]
        sentences = [head_measures.concentration_sentence(toy, base.concentration)]
        if other is not None:
            labels.append(other.model_key)
            shares.append(other.concentration.share)
            sentences.append(head_measures.concentration_sentence(
                f"{other.model_key} ({other.tokens} tokens of the evaluation text)", other.concentration,
                other.measure))
        st.plotly_chart(experiment_figures.shares_figure(labels, shares, head_measures.CLAIM,
                                                         head_measures.CARRIED), key=key("shares"))
    else:
        diagonals = {toy: base.collapse.diagonal}
        sentences = [head_measures.collapse_sentence(toy, base.collapse)]
        if other is not None:
            diagonals[other.model_key] = other.collapse.diagonal
            sentences.append(head_measures.collapse_sentence(
                f"{other.model_key} ({other.tokens} tokens of the evaluation text)", other.collapse))
        st.plotly_chart(experiment_figures.collapse_figure(diagonals, head_measures.COLLAPSE),
                        key=key("collapse"))
    for sentence in sentences:
        st.info(common.plain(sentence))
    if pretrained is None:
        st.caption("Pick MiniLM or SmolLM2 in the sidebar to measure a pretrained model too "
                   f"(the first {gradient_heads.MAX_TOKENS} tokens of the evaluation text).")


def experiments_view(model):
    """`model` (the sidebar's) is used only by the two head measures, when it is MiniLM or SmolLM2."""
    s = training_experiments.SETTINGS
    st.markdown(f"Each experiment trains a toy transformer ({s.task.name} {s.task.length} digits, "
                f"{s.n_layers} layers × {s.n_heads} heads, d_model {s.d_model}) with one change, and the "
                "same toy without it at the same seed; both are scored on 2,000 held-out prompts.")
    with st.form(key("form")):
        c1, c2, c3 = st.columns([3, 1, 1])
        choice = c1.selectbox("Experiment", **shared_view.linked(key("choice"), format_func=CHOICES.get, options=CHOICES))
        steps = c2.number_input("Steps", value=s.steps, step=20, **shared_view.linked(key("steps"), bounds=(20, 1000)))
        seed = c3.number_input("Seed", value=0, step=1, **shared_view.linked(key("seed"), bounds=(0, 999)))
        go = st.form_submit_button("Run", key=key("go"))
    if go:
        run_choice(choice, int(steps), int(seed), model)
    ss = st.session_state
    runs, measured = ss.get(key("runs"), {}), ss.get(key("pretrained"), {})
    shown = ss.get(key("shown"))
    if shown is None:
        st.caption(f"Run trains the baseline and the experiment (at most {LIMITS.max_lab_seconds:g} s in all, "
                   "one of the server's heavy jobs); results stay for the session.")
        return
    choice, steps, seed = shown
    base = runs[("baseline", steps, seed)]
    if choice in MEASURES:
        show_measure(choice, base, model, measured)
    else:
        show_training(runs[(choice, steps, seed)], base)
    st.download_button("Results CSV", exports.csv_text(table(runs, measured)), "training_experiments.csv",
                       "text/csv", key=key("csv"))
