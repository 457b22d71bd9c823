"""The Lab's "Patches, padding, sparse patterns" view: three steps of the brief no other page draws.

An image cut into the patches DINOv2 really gets and the tokens they become; the padding mask of
a real batch, with one head's weights batched and alone; sparse attention patterns next to full
attention with what each costs. One section is computed at a time (its own remembered choice);
the numbers come from `analysis.patterns`, the pictures from `figures.patterns`."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from attnviz.analysis import input_and_masks
from attnviz.analysis.vision import resolution_options
from attnviz.base import jobs, names
from attnviz.base.limits import LIMITS
from attnviz.base.timing import speed_words
from attnviz.figures import input_and_mask_figures
from attnviz.ui import common
from attnviz.ui import job_controls
from attnviz.ui import kept_inputs
from attnviz.ui import shared_view
from attnviz.uploads import images

PAGE = "lab"
VISION = "dinov2"          # the bundled vision model: the one whose patches are shown
SECTIONS = ("Image → patches → tokens", "Padding mask", "Sparse patterns")
TEXTS = ("The cat sat.", "A much longer sentence about the dog that ran all the way home.")
LENGTHS = [16, 32, 64, 128, 256, 512, 1024, 2048]


def key(name: str) -> str:
    return names.session_key(PAGE, name)


def size_text(count: float) -> str:
    """Bytes in binary units: 16 KiB, 4 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024


def patterns_view(model):
    st.caption("Three steps every transformer takes before or around attention, on the real models: "
               "how an image becomes tokens, how a batch of unequal sentences is padded and masked, "
               "and what sparse attention patterns skip and cost.")
    section = common.view_choice(key("patterns"), list(SECTIONS), label="Section")
    {SECTIONS[0]: patches_section, SECTIONS[1]: padding_section, SECTIONS[2]: sparse_section}[section](model)


# ---------------------------------------------------------------- (a) image -> patches -> tokens
def model_id(model) -> str:
    return f"{model.info.key}@{id(model)}"


def patch_tokens(vision, sample: str, size: int):
    """(photo, PatchTokens) per model, sample and input side, shared by sessions, bounded in bytes."""
    def make():
        photo = images.load_sample(sample)
        return photo, input_and_masks.patch_tokens(vision, photo, size)

    return common.cached_result(common.shared_cache("lab.patches", 8, 64), (model_id(vision), sample, size), make)


def patches_section(_model):
    samples = images.sample_images()
    if not samples:
        st.warning("No sample photos: scikit-image is not installed.")
        return
    try:
        with st.spinner(f"Loading {VISION}…"):
            vision = common.shared_model(VISION)
    except ValueError as err:
        st.error(common.plain(f"The patch view needs the bundled {VISION}: {err}"))
        return
    cfg = vision.cfg
    c1, c2 = st.columns(2)
    sample = c1.selectbox("Sample photo (scikit-image)", **shared_view.linked(key("pat_sample"), options=samples))
    sizes = resolution_options(cfg.patch_size)
    common.keep_in_options({key("pat_size"): (sizes, vision.image_size)})
    size = c2.select_slider("Input side (pixels)", **shared_view.linked(key("pat_size"), options=sizes),
                            help=f"{VISION} takes {vision.image_size} px; other sides change the patch count")
    try:
        photo, pt = patch_tokens(vision, sample, int(size))
    except ValueError as err:
        st.error(common.plain(str(err)))
        return
    (w, h), (left, top, side), p = pt.photo_size, pt.crop, pt.patch_size
    gh, gw = pt.grid
    regs = f", then {pt.n_registers} register tokens" if pt.n_registers else " (this model has no register tokens)"
    st.markdown(
        f"**{common.plain(sample)}**: {w}×{h} px → the centre square {side}×{side} (from x = {left}, y = {top}; "
        f"the sides are cut off, as DINOv2's processor does) → resized to {size}×{size} px (bicubic) and "
        f"normalised with ImageNet's mean and std → cut into a {gh}×{gw} grid of {p}×{p}-pixel patches. "
        f"**{pt.n_patches} patches → {pt.n_tokens} tokens**: [CLS] first{regs}, then the patches in raster "
        f"order (row by row, left to right). Each patch's {p}×{p}×3 = {3 * p * p} numbers go through the "
        f"patch embedding (a {p}×{p} convolution with stride {p}: one matrix product per patch) to a vector "
        f"of **d_model = {pt.d_model}**, and a position embedding is added (learned for a "
        f"{pt.pos_grid}×{pt.pos_grid} grid, {pt.pos_grid * p} px, interpolated bicubically to {gh}×{gw}).")
    c1, c2 = st.columns(2)
    c1.image(input_and_mask_figures.crop_picture(photo, pt.crop), caption="The photo; red: the square the model keeps", width=380)
    zoom = max(1, 448 // int(size))
    c2.image(input_and_mask_figures.grid_picture(pt.rgb, p, zoom, numbers=zoom * p >= 20, first_token=pt.n_prefix),
             caption=f"The model input (the normalised tensor, un-normalised to draw), {gh}×{gw} patches; "
                     "numbers: each patch's token index", width=380)
    cols = st.columns(4)
    cols[0].metric("Patches", f"{gh}×{gw} = {pt.n_patches}")
    cols[1].metric("Tokens", pt.n_tokens, help="what Model.trace runs: " + ", ".join(pt.tokens[:3]) + ", …")
    cols[2].metric("d_model", pt.d_model)
    cols[3].metric("Conv = matmul: max |diff|", f"{pt.embedding_diff:.2g}",
                   help="the patch embedding (a convolution) against each flattened patch times its "
                        "kernel as a matrix, plus the bias: the same numbers")
    st.markdown(f"**The token sequence** ({pt.n_tokens} tokens, index under each; the thumbnails are "
                "slices of the model's input tensor):")
    prefix = pt.tokens[:pt.n_prefix]
    st.image(input_and_mask_figures.token_strip([pt.patch_rgb(i) for i in range(pt.n_patches)], prefix,
                            per_row=24 if pt.n_tokens <= 600 else 40, cell=40 if pt.n_tokens <= 600 else 24))
    st.caption(f"Mean length of a patch embedding: {pt.patch_norm:.3g}; of the position embedding added to "
               f"it: {pt.position_norm:.3g}. The transformer never sees the grid: only this sequence of "
               f"{pt.n_tokens} vectors, the positions carried by what was added.")


# ---------------------------------------------------------------- (b) the padding mask
def clamp(name: str, upper: int):
    if st.session_state.get(name, 0) > upper:
        st.session_state[name] = upper


def padding_result(model, texts: tuple[str, ...], layer: int, head: int):
    store = common.shared_cache("lab.padding", 16, 64)
    return common.cached_result(store, (model_id(model), texts, layer, head),
                     lambda: input_and_masks.padding(model, list(texts), layer, head))


def padding_section(model):
    if model is None:
        st.info("Pick a text model in the sidebar.")
        return
    cfg = model.cfg
    c1, c2 = st.columns(2)
    texts = (c1.text_input("Sentence 1", TEXTS[0], key=key("pad_text0"), **kept_inputs.kept()),
             c2.text_input("Sentence 2", TEXTS[1], key=key("pad_text1"), **kept_inputs.kept()))
    clamp(key("pad_layer"), cfg.n_layers - 1)
    clamp(key("pad_head"), cfg.n_heads - 1)
    c1, c2 = st.columns(2)
    layer = int(c1.number_input("Layer", **shared_view.linked(key("pad_layer"), bounds=(0, cfg.n_layers - 1))))
    head = int(c2.number_input("Head", **shared_view.linked(key("pad_head"), bounds=(0, cfg.n_heads - 1))))
    try:
        r = padding_result(model, texts, layer, head)
    except ValueError as err:
        st.error(common.plain(str(err)))
        return
    st.markdown(f"{common.plain(model.info.key)}'s tokenizer batches the two sentences ({r.lengths[0]} and "
                f"{r.lengths[1]} tokens) into one {len(r.lengths)} × {r.width} tensor, padding the shorter one "
                f"on the right with **{common.plain(r.pad_token)}**. Its attention_mask (1 = real, 0 = pad) becomes "
                "the key-padding mask of every layer (`core.attention.padding_mask`): no query may look at a "
                "pad key. The batch runs once through the model, and each sentence once alone.")
    st.plotly_chart(input_and_mask_figures.padded_grid_figure(r.tokens, r.attention_mask, r.pad_token), key=key("pad_grid"))
    cols = st.columns(4)
    cols[0].metric("Pad-key weight, masked", f"{r.pad_weight:.3g}",
                   help=f"the most weight any real query of any head of layer {layer} gives a pad key")
    cols[1].metric("Real rows vs alone", f"{r.row_diff:.2g}",
                   help=f"this head; every head of layer {layer}: {r.layer_diff:.2g}; "
                        f"final hidden states: {r.hidden_diff:.2g}")
    cols[2].metric("Pad-key weight, no mask", f"{r.unmasked_pad_weight:.3g}",
                   help="the same batch run without the attention_mask: the most total weight a real "
                        "query gives the pad keys")
    cols[3].metric("Real rows change, no mask", f"{r.unmasked_row_diff:.2g}",
                   help="max |difference| from the sentence alone, every head of the layer")
    if r.pad_weight == 0 and r.row_diff < 1e-4:
        st.success(f"With the mask, pad keys get exactly 0 weight and every real row equals the sentence "
                   f"run alone to float precision ({r.row_diff:.2g} for this head, {r.layer_diff:.2g} over "
                   f"layer {layer}, {r.hidden_diff:.2g} for the final hidden states).")
    if r.causal:
        st.info(f"{common.plain(model.info.key)} is causal and the pads come after every real token: the causal "
                f"mask already hides them from real queries ({r.blocked_by_padding} query–key pairs are "
                "blocked by the padding mask alone), so here it changes only the pad rows, which are "
                "thrown away. With left padding, or an encoder, the mask is what keeps the rows exact.")
    else:
        st.info(f"Without the mask the real queries of this layer give up to {r.unmasked_pad_weight:.0%} of "
                f"their weight to pad tokens and their rows change by up to {r.unmasked_row_diff:.2g}: "
                f"{r.blocked_by_padding} query–key pairs are blocked by the padding mask alone.")
    for b in range(len(r.lengths)):
        n, labels = r.lengths[b], r.tokens[b]
        st.markdown(f"**Sentence {b + 1}** ({n} real tokens, {r.width - n} pads)")
        c1, c2, c3 = st.columns(3)
        c1.plotly_chart(input_and_mask_figures.key_mask_figure(r.allowed[b], labels, "Mask (1 = may look)"), key=key(f"pad_mask{b}"))
        c2.plotly_chart(input_and_mask_figures.attention_figure(r.batched[b], labels, labels, f"{names.head_name(layer, head)} "
                                            "in the padded batch", r.causal, zmax=1.0), key=key(f"pad_att{b}"))
        c3.plotly_chart(input_and_mask_figures.attention_figure(r.alone[b], labels[:n], labels[:n], "the sentence alone", r.causal,
                                            zmax=1.0), key=key(f"pad_alone{b}"))
    st.caption("Pad rows (queries that are pads) are computed too and then ignored: their keys are the "
               "real tokens, so their weights are not zero; only the pad columns are.")


# ---------------------------------------------------------------- (c) sparse patterns
def sparse_section(model):
    d_head = model.cfg.d_head if model is not None else 64
    c1, c2, c3, c4, c5 = st.columns(5)
    n = int(c1.select_slider("n (tokens)", value=64, **shared_view.linked(key("sp_n"), options=LENGTHS)))
    w = int(c2.slider("Local window w", value=8, **shared_view.linked(key("sp_w"), bounds=(1, 128)), help="keys with |i − j| < w"))
    s = int(c3.slider("Stride s", value=8, **shared_view.linked(key("sp_s"), bounds=(1, 128)), help="keys with i − j a multiple of s"))
    b = int(c4.slider("Block b", value=16, **shared_view.linked(key("sp_b"), bounds=(1, 256)), help="keys in the query's block of b"))
    causal = c5.toggle("Causal", model is not None and model.cfg.causal, **shared_view.linked(key("sp_causal"), kind=bool),
                       help="also only keys j ≤ i")
    widths = {"full": 1, "local": w, "strided": s, "block": b}
    labels = {k: input_and_masks.pattern_name(k, widths[k]) for k in input_and_masks.PATTERNS}
    masks = {k: input_and_masks.pattern_mask(k, n, widths[k], causal) for k in input_and_masks.PATTERNS}
    costs = {k: input_and_masks.pattern_cost(labels[k], masks[k], d_head) for k in input_and_masks.PATTERNS}
    for col, k in zip(st.columns(4), input_and_masks.PATTERNS):
        col.image(input_and_mask_figures.mask_picture(masks[k]),
                  caption=f"{labels[k]}: {costs[k].scores:,} scores ({costs[k].fraction:.1%} of n²)")
    st.caption(f"{n} × {n} masks, query rows down, key columns across; dark = computed. Strided is the "
               "strided half of the Sparse Transformer (Child et al. 2019), which pairs it with a local "
               f"window of s in another head; local is the same pattern as the Variants view's local:{w}.")
    st.dataframe(pd.DataFrame([dict(
        pattern=c.name, **{"scores computed": c.scores, "% of n²": round(100 * c.fraction, 2),
                           "score memory": size_text(c.score_bytes), "QKᵀ FLOPs": c.flops_qk,
                           "A·V FLOPs": c.flops_av, "dense kernel + mask: scores": c.dense_scores,
                           "dense kernel + mask: memory": size_text(c.dense_bytes)})
        for c in costs.values()]), hide_index=True, key=key("sp_costs"))
    where = f"{model.info.key}'s d_head = {d_head}" if model is not None else f"d_head = {d_head}"
    st.caption(f"Per head and layer, float32 scores, {where}; FLOPs count a multiply-add as 2. "
               "A kernel that skips what it masks pays the left columns; a dense kernel given the mask "
               "still computes all n² scores (and reads an n² mask) before throwing the masked ones "
               "away: masking alone saves nothing.")
    st.plotly_chart(input_and_mask_figures.fraction_figure(list(labels.values()), [c.fraction for c in costs.values()],
                                       "Scores computed"), key=key("sp_fraction"))
    measure_section(n, widths, d_head, causal, labels)


def measure_section(n: int, widths: dict, d_head: int, causal: bool, labels: dict):
    settings = (n, tuple(widths.items()), d_head, causal)
    if st.button("Measure on this CPU", key=key("sp_go")):
        deadline = jobs.Deadline(LIMITS.max_lab_seconds, "the sparse-pattern measurement")
        try:
            with job_controls.heavy_job("a sparse-pattern measurement") as cancel, st.spinner("Measuring…"):
                def check():
                    deadline.check()
                    cancel.check()

                st.session_state[key("sp_rows")] = (settings, input_and_masks.measure_patterns(
                    list(input_and_masks.PATTERNS), n, widths, d_head, causal, check=check))
        except (jobs.JobTimeout, ValueError) as err:
            st.error(common.plain(str(err)))
    kept = st.session_state.get(key("sp_rows"))
    if not kept or kept[0] != settings:
        st.caption("Measure times each pattern on random Q, K, V (one head, these n and d_head) twice: "
                   "through the dense kernel with the mask, and through a kernel that computes only the "
                   "pattern's scores (local by query blocks, block per block, strided per phase; full: "
                   "the same kernel without a mask).")
        return
    rows = kept[1]
    st.dataframe(pd.DataFrame([dict(pattern=r.name, **{
        "dense + mask (ms)": round(r.dense_ms, 3), "skipping kernel (ms)": round(r.sliced_ms, 3),
        "speed-up": round(r.dense_ms / r.sliced_ms, 2) if r.sliced_ms > 0 else None,
        "max |difference|": f"{r.max_diff:.2g}"}) for r in rows]), hide_index=True, key=key("sp_measured"))
    st.caption(measured_caption(rows))


def measured_caption(rows) -> str:
    """What was measured, in words taken from the measured numbers (never a claim beside them)."""
    dense = [r.dense_ms for r in rows]
    sparse = ", ".join(f"{r.name} {r.dense_ms / r.sliced_ms:.2f}× ({speed_words(r.dense_ms / r.sliced_ms)})"
                       for r in rows if r.sliced_ms > 0)
    same = max(dense) <= 1.2 * min(dense)
    spread = ("about the same for every pattern: it computes all n² scores whatever the mask" if same else
              "a spread wider than 20 %: the mask changed its cost here, or the machine was busy (rerun "
              "to see which)")
    return (f"Wall-clock medians of {input_and_masks.REPEATS} runs after warm-ups "
            f"(base.timing.measure), alternating the two kernels. The dense kernel with a mask took "
            f"{min(dense):.3g}–{max(dense):.3g} ms across the patterns, {spread}. The skipping kernels "
            f"against it: {sparse}. They give the same attention (max |difference|); at short lengths "
            "Python's per-block loop can cost more than the skipped scores save.")
