"""The Lab's toy ViT: learned beside 2-D sinusoidal positions, full beside axial attention, each
configuration TRAINED HERE on synthetic images (never a pretrained model), with exact held-out
counts, attention FLOPs as counted for real axial attention, and a sentence read from the counts
(`attnviz.toys.toy_vit`, `attnviz.figures.vit_figures`)."""
from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from attnviz.base import exports, jobs, names
from attnviz.base.limits import LIMITS
from attnviz.figures import vit_figures
from attnviz.toys import toy_vit
from attnviz.ui import job_controls, shared_view
from attnviz.ui.common import plain

PAGE = "lab"
VIEW = "Toy ViT: 2-D positions, axial attention"   # its name among the Lab's views
LABELS = {f"{p}, {a}": (p, a) for p, a in toy_vit.CONFIGURATIONS}


def key(name: str) -> str:
    return names.session_key(PAGE, f"vit_{name}")


def train_all(chosen: list[str], steps: int, seed: int) -> list:
    """Each chosen configuration in turn, under one heavy-job slot, a progress bar and the Lab's
    time limit (checked before every block, with whether this browser session is still there). On
    a refusal or the limit: the message, and the configurations trained to the end so far."""
    settings = [toy_vit.VitSettings(positions=LABELS[c][0], attention=LABELS[c][1], steps=steps, seed=seed)
                for c in chosen]
    for s in settings:
        s.check()
    results, live = [], st.empty()
    with live.container():
        bar = st.progress(0.0, "training…")
    deadline = jobs.Deadline(LIMITS.max_lab_seconds, "the toy ViT training")
    try:
        with job_controls.heavy_job("a toy ViT training") as cancel:
            def check():
                deadline.check()
                cancel.check()

            for i, s in enumerate(settings):
                started = time.perf_counter()

                def report(step, total, loss, i=i, s=s):
                    if step % 10 == 0 or step == total:  # redrawing every step would cost more than training
                        left = (time.perf_counter() - started) / step * (total - step)
                        bar.progress((i + step / total) / len(settings),
                                     f"{s.label} ({i + 1} of {len(settings)}): step {step}/{total}, "
                                     f"loss {loss:.3f} · about {left:.0f} s left for it")

                results.append(toy_vit.train(s, report, check=check))
    except (jobs.JobTimeout, jobs.JobCancelled) as err:
        st.error(plain(f"{err}, after {len(results)} of {len(settings)} configurations. Choose fewer "
                       "configurations or steps."))
    finally:
        live.empty()
    return results


def table(results) -> pd.DataFrame:
    return pd.DataFrame([dict(
        configuration=r.settings.label, positions=r.settings.positions, attention=r.settings.attention,
        steps=r.steps_done, **{"stopped early": r.stopped_early, "correct": r.correct, "held out": r.total,
                               "accuracy (%)": round(100 * r.accuracy, 2),
                               "attention FLOPs (real axial)": r.flops,
                               "attention FLOPs computed here": r.computed_flops,
                               "seconds": round(r.seconds, 1)}) for r in results])


def layer_names(r) -> list[str]:
    kinds = {"full": lambda i: "full", "axial": lambda i: "row" if i % 2 == 0 else "column"}[r.settings.attention]
    return [f"layer {i} ({kinds(i)})" for i in range(r.settings.n_layers)]


def attention_maps(results):
    """One held-out image's chosen patch, what it attends to in every trained configuration."""
    held = toy_vit.held_out_set()
    c1, c2 = st.columns(2)
    index = int(c1.number_input("Held-out image", value=0, step=1, **shared_view.linked(key("image"), bounds=(0, len(held.labels) - 1))))
    mark = c2.radio("Query patch", horizontal=True, **shared_view.linked(key("mark"), options=["first mark", "second mark"]))
    row, col = (int(v) for v in held.marks[index, 0 if mark == "first mark" else 1])
    maps = {r.settings.label: toy_vit.patch_maps(r.net, held.pixels[index], row * toy_vit.GRID + col)
            for r in results}
    st.markdown(f"Image {index} is **{toy_vit.CLASSES[held.labels[index]]}**; the query is the patch of its "
                f"{mark} (row {row}, column {col}), outlined in red.")
    st.plotly_chart(vit_figures.patch_attention_figure(held.pixels[index], maps, (row, col),
                                                       {r.settings.label: layer_names(r) for r in results}),
                    key=key("maps"))


def vit_view(_model=None):
    """The view (the Lab passes its picked model; this view trains its own)."""
    st.markdown(
        "**Trained here in the Lab, not a pretrained model.** Each image is 32 × 32 pixels of noise with two "
        f"bright {toy_vit.MARK} × {toy_vit.MARK} marks, cut into {toy_vit.GRID} × {toy_vit.GRID} = "
        f"{toy_vit.N_PATCHES} patches of {toy_vit.PATCH} × {toy_vit.PATCH} pixels; the class says whether the "
        "marks share a row, a column, or neither, so only their positions tell it. A small ViT built of this "
        "app's own blocks (patch embedding, positions, two self-attention blocks, max pooling, a linear "
        "classifier) is trained with **learned** or **2-D sinusoidal** positions (half the channels code the "
        "row, half the column) and **full** or **axial** attention (the first block sees only its row, the "
        f"second only its column), then scored on {toy_vit.HELD_OUT} held-out images.")
    st.info("Axial attention here is a mask on the full n × n scores: it computes as much as full attention, so "
            "its wall time here is not lower. The FLOPs shown as 'real axial' are counted for an axial "
            "attention that scores only the keys of a row or a column: n · (r + c) · d against full's 2 · n² · d "
            "for a row and a column block.")
    ss = st.session_state
    with st.form(key("form")):
        c1, c2 = st.columns(2)
        steps = c1.number_input("Steps", value=150, step=10, **shared_view.linked(key("steps"), bounds=(10, 600)))
        seed = c2.number_input("Seed", value=0, step=1, **shared_view.linked(key("seed"), bounds=(0, 999)))
        chosen = st.multiselect("Configurations", default=list(LABELS),
                                **shared_view.linked(key("configs"), options=LABELS, kind=list))
        go = st.form_submit_button("Train", key=key("train"))
    if go:
        if not chosen:
            st.warning("Choose at least one configuration.")
        else:
            try:
                ss[key("results")] = train_all(chosen, int(steps), int(seed))
            except ValueError as err:   # settings, or no free heavy-job slot
                st.error(plain(str(err)))
    results = ss.get(key("results")) or []
    if not results:
        st.caption(f"Train runs each chosen configuration in turn (at most {LIMITS.max_lab_seconds:g} s in all, "
                   "one of the server's heavy jobs); 5 to 10 s each at 150 steps when measured here.")
        return
    if any(r.stopped_early for r in results):
        st.warning("Some configurations stopped at the training time budget before their last step "
                   "(see 'steps' in the table): compare them with care.")
    frame = table(results)
    st.dataframe(frame, hide_index=True, key=key("table"))
    st.download_button("Results CSV", lambda: exports.csv_text(frame), "toy_vit.csv", "text/csv", key=key("csv"))
    labels = [r.settings.label for r in results]
    c1, c2 = st.columns(2)
    c1.plotly_chart(vit_figures.accuracy_figure(labels, [r.correct for r in results], [r.total for r in results],
                                                1 / len(toy_vit.CLASSES)), key=key("accuracy"))
    c2.plotly_chart(vit_figures.flops_figure(labels, [r.flops for r in results],
                                             [r.computed_flops for r in results]), key=key("flops"))
    st.markdown(toy_vit.summary(results))
    attention_maps(results)
