"""The Images page: what each head of a vision transformer looks at in a photo.

The photo is picked (or uploaded) at the top of the main area, its settings sit in the sidebar;
the one head editor (`attnviz.ui.head_editor`) on the left, and beside it the one view the user chose (remembered across buttons and downloads):
only that view's maps are computed and drawn. Every view uses the masked model.
"""
from __future__ import annotations

import hashlib

import pandas as pd
import streamlit as st
import torch

from attnviz.analysis import head_answers, vision
from attnviz.base import exports
from attnviz.base.limits import LIMITS
from attnviz.base.names import session_key
from attnviz.core import pixels
from attnviz.figures import image_figures
from attnviz.figures import render
from attnviz.figures.attention_figures import distance_figure
from attnviz.ui import common, image_text_view, lab_reader, shared_view
from attnviz.ui.head_editor import head_editor, metric_delta
from attnviz.ui.heads_corpus import page_tool
from attnviz.uploads import images

PAGE = "images"
UPLOAD_TYPES = ["png", "jpg", "jpeg", "webp", "gif", "bmp", "tif", "tiff"]
VIEWS = ("CLS → patches", "Patch query", "Rollout & saliency", "Artefact tokens", "Attention distance",
         "Head-mask effect", "Export")


def K(name: str) -> str:
    return session_key(PAGE, name)


@st.cache_resource(max_entries=8, show_spinner=False)
def decoded(image_key: str, _data: bytes):
    """Decoded photo (and its display copy) per content digest: reruns never decode the same
    bytes twice."""
    photo = images.open_image(_data)
    return photo, image_figures.display_image(photo)


SCALES = {"own range": "each tile scaled to its own range (dark = its weakest patch, bright = its strongest)",
          "one scale for all tiles": "all tiles on one colour scale"}
FIT_LABELS = {"crop": "centre crop", "pad": "pad", "squeeze": "squeeze"}
FIT_SAID = {"crop": "centre square cropped", "pad": "padded to a square with the mean colour",
            "squeeze": "squeezed"}


@st.cache_resource(max_entries=8, show_spinner=False)
def squared(image_key: str, fit: str, _photo, _fill):
    """The photo made square as the model sees it (core.pixels.fit_square) and its display copy,
    per photo and fit: the overlays lie over exactly the pixels the model saw."""
    square = pixels.fit_square(_photo, fit, _fill)
    return square, image_figures.display_image(square)


@st.cache_resource(max_entries=3, show_spinner=False)
def traced(model_key: str, image_key: str, size: int, mask_key: bytes, _model, _photo, _mask):
    # cache_resource, not cache_data: a 448-px trace holds ~300 MB of weights; no copy per rerun.
    return _model.trace(_photo, head_mask=_mask, image_size=size, states=True)


def usable(candidate, patch_size: int):
    """(photo, display copy) of (label, image key, bytes) if this model can trace it; else
    ValueError. A file that failed once is not decoded again: its message is kept
    in this session, per content digest, and said again at once."""
    ss = st.session_state
    failed = ss.setdefault(K("failed"), {})
    if candidate[1] in failed:
        raise ValueError(failed[candidate[1]])
    try:
        photo, shown = decoded(candidate[1], candidate[2])
    except ValueError as err:
        if len(failed) >= 16:           # a bounded memo: the oldest failure goes first
            failed.pop(next(iter(failed)))
        failed[candidate[1]] = str(err)
        raise
    vision.check_photo(photo, patch_size)
    return photo, shown


def upload_key(upload) -> str:
    """The upload's content digest, hashed once per uploaded file (not on every slider nudge)."""
    ss = st.session_state
    memo = ss.get(K("digest"))
    if memo is None or memo[0] != upload.file_id:
        memo = (upload.file_id, "upload:" + hashlib.sha256(upload.getvalue()).hexdigest())
        ss[K("digest")] = memo
    return memo[1]


def choose_photo(cfg):
    """(label, image key, bytes, photo, display copy) from the main area's picker; a bad (or no) upload keeps
    the last photo that worked, else the first sample. None when there is nothing to show."""
    samples = images.sample_images()
    # In the main area, above the views: a newcomer looks for the uploader here, not in the sidebar.
    left, right = st.columns([1, 3], vertical_alignment="center")
    with left:
        source = st.radio("Image", **shared_view.linked(K("source"), options=["Sample photo", "Upload"]), horizontal=True)
    upload = sample = None
    with right:
        if source == "Upload":
            upload = st.file_uploader(
                "Photo (PNG, JPEG, WebP, GIF, BMP, TIFF)", type=UPLOAD_TYPES, key=K("upload"),
                help=f"Up to {LIMITS.max_upload_bytes / 10**6:g} MB ({LIMITS.max_upload_bytes:,} bytes) per "
                     f"file; larger files are refused. At least {cfg.patch_size} px (one patch of this "
                     f"model) on each side, the longer side at most {LIMITS.max_image_aspect:g} times the "
                     "shorter.")
        else:
            sample = st.selectbox("Sample photo (scikit-image)", **shared_view.linked(K("sample"), options=samples))
    chosen = None
    if upload is not None:
        chosen = (upload.name, upload_key(upload), upload.getvalue())
    elif source == "Sample photo" and samples:
        chosen = (sample, "sample:" + sample, samples[sample].read_bytes())
    if chosen is not None:
        try:
            return (*chosen, *usable(chosen, cfg.patch_size))
        except ValueError as err:
            st.error(f"Could not use {common.plain(chosen[0])}: {common.plain(str(err))}")
    # The last photo is remembered only once a view has been drawn from it, and checked again
    # here: another model may have larger patches.
    fallbacks = [st.session_state.get(K("last"))]
    fallbacks += [(name, "sample:" + name, path.read_bytes()) for name, path in list(samples.items())[:1]]
    for fallback in filter(None, fallbacks):
        try:
            found = (*fallback, *usable(fallback, cfg.patch_size))
        except ValueError:
            st.session_state.pop(K("last"), None)
            continue
        if source == "Upload":
            st.caption(f"Showing {common.plain(fallback[0])} until a photo is uploaded that can be read.")
        return found
    return None


class View:
    """One photo, one resolution, one applied mask: the chosen view of it."""

    def __init__(self, model, chosen, size: int, alpha: float, fit: str = "crop"):
        self.model, self.cfg = model, model.cfg
        self.label, self.image_key, self.photo_bytes, self.original, _ = chosen
        self.fit = fit
        self.photo, self.shown = squared(self.image_key, fit, self.original, tuple(model.image_mean))
        self.size, self.alpha = size, alpha
        self.grid = size // self.cfg.patch_size

    def trace(self, mask):
        return traced(self.model.info.key, f"{self.image_key}:{self.fit}", self.size, mask.numpy().tobytes(),
                      self.model, self.photo, mask if (mask == 0).any() else None)

    def effect(self, mask):
        """The head editor's effect: the masked run first, then the drawing of the chosen view."""
        with st.spinner(f"Tracing {self.grid * self.grid} patches…"):
            tr = self.trace(mask)
        return lambda: self.draw(mask, tr)

    def draw(self, mask, tr):
        heads_off = int((mask == 0).sum())
        w, h = self.original.size
        shape = "" if w == h else f"{FIT_SAID[self.fit]}, "
        st.caption(f"**{common.plain(self.label)}** · {w}×{h} px, {shape}resized to "
                   f"{self.size}×{self.size} · {self.grid}×{self.grid} patches of {self.cfg.patch_size} px · "
                   f"{tr.n} tokens" + (f" · {heads_off} heads off" if heads_off else ""))
        extra = image_text_view.views(self.model)      # a model that reads text too: its views
        options = VIEWS + tuple(extra)
        if st.session_state.get(K("view_choice")) not in (None, *options):
            st.session_state[K("view_choice")] = VIEWS[0]
        choice = st.segmented_control("view", default=VIEWS[0], required=True, **shared_view.linked(K("view_choice"), options=options),
                                      label_visibility="collapsed")
        off = (mask == 0)[tr.layers]
        head_mask = mask if heads_off else None
        own = {VIEWS[0]: self.cls_view, VIEWS[1]: self.query_view, VIEWS[2]: self.rollout_view,
               VIEWS[3]: self.artefact_view, VIEWS[4]: self.distance_view, VIEWS[5]: self.mask_view,
               VIEWS[6]: self.export_view}
        if choice in own:
            own[choice](tr, off, head_mask)
        else:
            extra[choice](self, tr, off, head_mask)
        # Only a photo a view could be drawn from becomes the one a later bad upload falls back to.
        st.session_state[K("last")] = (self.label, self.image_key, self.photo_bytes)

    def cls_overlay(self, tr, off, every: bool, layer: int, tile: int = 224, shown=None, shared=False):
        maps = vision.cls_maps(tr)                                              # (L, H, gh, gw)
        shown = self.shown if shown is None else shown
        if every:
            return image_figures.head_overlays(shown, maps, tr.layers, tile=tile // 2, alpha=self.alpha, off=off,
                                          shared=shared)
        return image_figures.head_overlays(shown, maps[layer:layer + 1], [layer], tile=tile,
                                      alpha=self.alpha, off=off[layer:layer + 1], shared=shared)

    def scale_choice(self) -> bool:
        """True when the tiles share one colour scale (the user's choice; default: own range)."""
        return st.radio("Colour scale", **shared_view.linked(K("scale"), options=SCALES), horizontal=True,
                        help="own range: each tile from its own weakest (dark) to strongest (bright) "
                             "patch, so weak heads still show a pattern; one scale: tiles compare by "
                             "colour") == "one scale for all tiles"

    def scale_bar(self, maps, shared: bool, what: str):
        """The colour bar under the overlays: its ends are the shared range's values, or each tile's own."""
        if shared:
            low, high = image_figures.map_range(maps)
            st.image(image_figures.colour_bar(f"{low:.3g}", f"{high:.3g}", title=what + ", one scale for all tiles"))
        else:
            st.image(image_figures.colour_bar("tile's min", "tile's max", title=what + ", each tile its own range"))

    def cls_view(self, tr, off, head_mask):
        every = st.radio("Show", **shared_view.linked(K("view"), options=["One layer", "Every layer × head"]), horizontal=True)
        layer = None
        if every == "One layer":
            layer = st.slider("Layer", **shared_view.linked(K("layer"), bounds=(0, self.cfg.n_layers - 1)))
        outline = st.checkbox("Outline the high-norm artefact patches", key=K("outline"),
                              help="attention sinks, flagged as in the artefacts view")
        found = self.artefacts(tr) if outline else None
        shown = None if not (found and found.patches) else image_figures.mark_patches(self.shown, found.patches, tr.grid)
        shared = self.scale_choice()
        st.image(self.cls_overlay(tr, off, every != "One layer", layer, shown=shown, shared=shared),
                 caption="Attention from CLS to each patch; " + SCALES[
                     "one scale for all tiles" if shared else "own range"]
                 + ("" if found is None else f"; {len(found.patches)} artefact patch(es) outlined"))
        maps = vision.cls_maps(tr)
        self.scale_bar(maps if every != "One layer" else maps[layer], shared, "attention weight")

    def query_view(self, tr, off, head_mask):
        cols = st.columns(3)
        row = int(cols[0].number_input("Patch row", **shared_view.linked(K("row"), bounds=(0, self.grid - 1))))
        col = int(cols[1].number_input("Patch column", **shared_view.linked(K("col"), bounds=(0, self.grid - 1))))
        q_layer = cols[2].slider("Layer", **shared_view.linked(K("q_layer"), bounds=(0, self.cfg.n_layers - 1)))
        query = vision.patch_query_maps(tr, row, col)                          # (L, H, gh, gw)
        marked = image_figures.mark_patches(self.shown, [(row, col)], tr.grid)
        shared = self.scale_choice()
        st.image(image_figures.head_overlays(marked, query[q_layer:q_layer + 1], [q_layer], tile=224,
                                        alpha=self.alpha, off=off[q_layer:q_layer + 1], shared=shared),
                 caption=f"Where patch ({row}, {col}) (outlined) attends, per head of layer {q_layer}; "
                 + SCALES["one scale for all tiles" if shared else "own range"])
        self.scale_bar(query[q_layer], shared, "attention weight")

    def rollout_view(self, tr, off, head_mask):
        discount = st.checkbox("Discount the high-norm artefact patches", key=K("discount"),
                               help="attention sinks: their keys are taken out of every layer before the rollout "
                                    "(flagged as in the artefacts view), and they are outlined")
        found = self.artefacts(tr) if discount else None
        drop = None if found is None else vision.artefact_tokens(tr, found)
        shown = self.shown if not (found and found.patches) else image_figures.mark_patches(self.shown, found.patches, tr.grid)
        left, middle, right = st.columns(3)
        left.image(self.shown, caption="Photo")
        middle.image(render.overlay_patch_map(shown, vision.rollout_map(tr, head_mask, discount=drop), self.alpha),
                     caption="Attention rollout from CLS over all layers (kept heads), scaled to its own range"
                     + ("" if found is None else f"; {len(found.patches)} artefact patch(es) discounted, outlined"))
        if tr.saliency is not None:
            right.image(render.overlay_patch_map(self.shown, tr.saliency, self.alpha, normalise=False),
                        caption="The model's saliency output (0…1)")
        else:
            right.info("This model has no saliency decoder (only the bundled dinov2 does).")

    def artefacts(self, tr):
        ss = st.session_state
        return vision.find_artefacts(tr, ss.get(K("a_layer"), self.cfg.n_layers - 1),
                                     ss.get(K("k"), vision.ARTEFACT_K))

    def artefact_view(self, tr, off, head_mask):
        cols = st.columns(2)
        cols[0].slider(f"Hidden state: input of block … ({self.cfg.n_layers} = final output)",
                       0, self.cfg.n_layers, key=K("a_layer"))
        cols[1].slider("Flag norms above median + k·MAD; k =", 2.0, 20.0, vision.ARTEFACT_K, 0.5, key=K("k"))
        found = self.artefacts(tr)
        st.image(render.overlay_patch_map(image_figures.mark_patches(self.shown, found.patches, tr.grid),
                                          found.norms, self.alpha),
                 caption="Hidden-state norm per patch, scaled to its own range; flagged patches outlined")
        st.write(f"Median norm {found.median:.2f}, MAD {found.mad:.2f}, threshold {found.threshold:.2f}: "
                 f"**{len(found.patches)} of {self.grid * self.grid} patches flagged**. DINOv2 reuses a few "
                 "low-information patches as global scratch space (Darcet et al. 2024, 'Vision "
                 "Transformers Need Registers'): their hidden states have outsized norms and draw "
                 "attention. The effect is strongest in large models; ViT-S/14 shows milder outliers, "
                 "clearest at the last block's input.")
        if found.patches:
            st.dataframe(pd.DataFrame(
                [(r, c, float(found.norms[r, c]), float(found.robust_z[r, c])) for r, c in found.patches],
                columns=["row", "column", "norm", "MADs above median"]), hide_index=True)

    def distance_view(self, tr, off, head_mask):
        distances = vision.attention_distance_px(tr, self.cfg.patch_size)
        st.plotly_chart(distance_figure(distances, unit=f"px at {self.size} px"), key=K("distance"))
        st.caption("Attention-weighted distance between patch centres, mean over query patches, CLS "
                   "left out (the ViT paper's plot, where early layers mix local and global heads "
                   "and deeper layers are mostly global).")

    def mask_view(self, tr, off, head_mask):
        if head_mask is None:
            st.info("All heads are on. Switch heads off in the grid and press Apply to see what changes.")
            return
        before = self.trace(torch.ones_like(head_mask))          # the full model: only in this view
        effect = vision.mask_effect(before, tr, head_mask)
        heads_off = int((head_mask == 0).sum())
        st.info(head_answers.image_mask_sentence(effect.cls_cosine, effect.saliency_iou, effect.saliency_mean_abs_change,
                                             heads_off, int(head_mask.numel())))
        cols = st.columns(3)
        cols[0].metric("CLS embedding cosine", f"{effect.cls_cosine:.4f}", **metric_delta(
            effect.cls_cosine - 1, f"{effect.cls_cosine - 1:+.4f} vs all heads", "higher", 4))
        if effect.saliency_iou is not None:
            cols[1].metric("Saliency IoU at 0.5", f"{effect.saliency_iou:.3f}", **metric_delta(
                effect.saliency_iou - 1, f"{effect.saliency_iou - 1:+.3f} vs all heads", "higher", 3))
            change = effect.saliency_mean_abs_change
            cols[2].metric("Saliency mean |change|", f"{change:.4f}", **metric_delta(
                change, f"{change:+.4f} vs all heads", "lower", 4))
            st.image([render.overlay_patch_map(self.shown, s, self.alpha, normalise=False)
                      for s in (before.saliency, tr.saliency)],
                     caption=["Saliency, all heads", f"Saliency, {heads_off} heads off"], width=300)
        rollouts = [vision.rollout_map(before), vision.rollout_map(tr, head_mask)]
        st.image([render.overlay_patch_map(self.shown, r, self.alpha) for r in rollouts],
                 caption=["Rollout, all heads", "Rollout, heads off"], width=300)
        st.caption("Each rollout is scaled to its own range; the saliency maps share the model's 0…1 scale.")

    def export_view(self, tr, off, head_mask):
        # Callables: the files are built only when a button is clicked, not on every rerun.
        ss = st.session_state
        stem = exports.file_stem(self.model.info.key, self.label.rsplit(".", 1)[0], self.fit)
        every = ss.get(K("view")) == "Every layer × head"
        layer = ss.get(K("layer"), self.cfg.n_layers - 1)
        shared = ss.get(K("scale")) == "one scale for all tiles"
        st.download_button("PNG: the CLS → patch overlays shown",
                           lambda: render.image_png(self.cls_overlay(tr, off, every, layer, shared=shared)),
                           f"{stem}_{self.size}px_cls_view.png", "image/png", key=K("png_view"))
        st.download_button(
            "PNG: every head's CLS → patch overlay",
            lambda: render.image_png(image_figures.head_overlays(self.shown, vision.cls_maps(tr), tr.layers,
                                                            tile=160, alpha=self.alpha, off=off)),
            f"{stem}_{self.size}px_heads.png", "image/png", key=K("png"))
        query = (int(ss.get(K("row"), self.grid // 2)), int(ss.get(K("col"), self.grid // 2)))
        st.download_button(
            "NPZ: maps (CLS, query, rollout, distances, saliency, norms)",
            lambda: vision.maps_npz(tr, self.cfg.patch_size, head_mask=head_mask, query=query,
                                    artefacts=self.artefacts(tr)),
            f"{stem}_{self.size}px_maps.npz", "application/octet-stream", key=K("npz"))
        st.caption("The NPZ opens with `numpy.load(path)` (no pickles): cls_maps [L, H, gh, gw], "
                   "query_maps, rollout, mean_distance_px [L, H], saliency, artefact norms and flags, "
                   "head_mask, grid, patch_size.")


def settings(model):
    """Resolution and opacity (sidebar); remembered values a smaller model or grid made out of
    range are clamped before their widgets are drawn (Streamlit raises on them)."""
    ss, cfg = st.session_state, model.cfg
    options = vision.model_resolutions(model)
    if ss.get(K("size")) not in options:
        ss[K("size")] = vision.default_resolution(model)
    n_prefix = cfg.n_prefix
    with st.sidebar:
        size = st.select_slider(
            "Input resolution", options, key=K("size"),
            format_func=lambda s: f"{s} px · {vision.token_count(s, cfg.patch_size, n_prefix)} tokens")
        alpha = st.slider("Overlay opacity", 0.0, 1.0, 0.55, 0.05, key=K("alpha"))
        fit = st.radio("Non-square photo", list(FIT_LABELS), format_func=FIT_LABELS.get, key=K("fit"),
                       horizontal=True, help="the model takes a square: centre crop (the default) cuts "
                       "the longer side's edges; pad adds mean-colour bars; squeeze stretches the photo")
    grid = size // cfg.patch_size
    for name, top, default in (("layer", cfg.n_layers - 1, cfg.n_layers - 1),
                               ("q_layer", cfg.n_layers - 1, cfg.n_layers - 1),
                               ("a_layer", cfg.n_layers, cfg.n_layers - 1),
                               ("row", grid - 1, grid // 2), ("col", grid - 1, grid // 2)):
        ss[K(name)] = min(ss.get(K(name), default), top)
    return size, alpha, fit


def page():
    """The whole page below its title."""
    model = common.model_picker(tasks=("vision",))
    if st.button("Text attending to an image: a small reader trained here in the Lab (not a pretrained "
                 "model) →", key=session_key(PAGE, "to_reader"), type="tertiary"):
        lab_reader.open_in_lab()
    if model is None:
        st.stop()
    chosen = choose_photo(model.cfg)
    if chosen is None:
        st.info("Upload a photo to begin (scikit-image's sample photos are not installed).")
        st.stop()
    size, alpha, fit = settings(model)
    view = View(model, chosen, size, alpha, fit)
    head_editor(model.cfg, PAGE, model_key=model.info.key, effect=view.effect, split=(1, 3), link=True)
    with st.expander("Corpus run: the mask above over many photos", expanded=False):
        page_tool(PAGE, model)
    shared_view.share_bar(PAGE)
