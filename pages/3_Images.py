"""Images: what each head of a vision transformer looks at in a photo."""
import hashlib

import pandas as pd
import streamlit as st
import torch

import attnviz
from attnviz import ui
from attnviz.analysis import vision
from attnviz.figures import attention as viz
from attnviz.core.images import sample_images
from attnviz.base.limits import LIMITS

st.set_page_config(page_title="attnviz · Images", layout="wide")
st.title("Images — what each head looks at")
K = "img_"  # session-state prefix of this page's widgets
UPLOAD_TYPES = ["png", "jpg", "jpeg", "webp", "gif", "bmp", "tif", "tiff"]

model = ui.model_picker(tasks=("vision",))
if model is None:
    st.stop()
cfg = model.cfg
n_prefix = 1 + cfg.n_registers


@st.cache_resource(max_entries=8, show_spinner=False)
def decoded(image_key: str, _data: bytes):
    """Decoded photo per content digest: reruns never decode the same bytes twice."""
    return attnviz.open_image(_data)


def usable(candidate):
    """The decoded photo of (label, image key, bytes) if this model can trace it; else ValueError."""
    photo = decoded(candidate[1], candidate[2])
    vision.check_photo(photo, cfg.patch_size)
    return photo


@st.cache_resource(max_entries=3, show_spinner=False)
def traced(model_key: str, image_key: str, size: int, mask_key: bytes, _model, _photo, _mask):
    # cache_resource, not cache_data: a 448-px trace holds ~300 MB of weights; no copy per rerun.
    return _model.trace(_photo, head_mask=_mask, image_size=size, states=True)


# --- Which photo ------------------------------------------------------------------------------
samples = sample_images()
MAX_MB = LIMITS.max_upload_bytes / 10**6
with st.sidebar:
    source = st.radio("Image", ["Sample photo", "Upload"], key=K + "source", horizontal=True)
    if source == "Upload":
        upload = st.file_uploader(
            "Photo (PNG, JPEG, WebP, GIF, BMP, TIFF)", type=UPLOAD_TYPES, key=K + "upload",
            help=f"Up to {MAX_MB:g} MB ({LIMITS.max_upload_bytes:,} bytes) per file; larger files "
                 f"are refused. At least {cfg.patch_size} px (one patch of this model) on each "
                 f"side, the longer side at most {LIMITS.max_image_aspect:g} times the shorter.")
    else:
        upload = None
        sample = st.selectbox("Sample photo (scikit-image)", list(samples), key=K + "sample")

chosen = None  # (label, image key, bytes)
if upload is not None:
    data = upload.getvalue()
    chosen = (upload.name, "upload:" + hashlib.sha256(data).hexdigest(), data)
elif source == "Sample photo" and samples:
    chosen = (sample, "sample:" + sample, samples[sample].read_bytes())
photo = None
if chosen is not None:
    try:
        photo = usable(chosen)
    except ValueError as err:
        st.error(f"Could not use {ui.plain(chosen[0])}: {ui.plain(str(err))}")
if photo is None:
    # A bad (or no) upload: keep showing the last photo that worked, else the first sample. The
    # last photo is remembered only once the whole page has been drawn from it (end of script),
    # and checked again here: another model may have larger patches.
    fallbacks = [st.session_state.get(K + "last")]
    fallbacks += [(name, "sample:" + name, path.read_bytes())
                  for name, path in list(samples.items())[:1]]
    for fallback in filter(None, fallbacks):
        try:
            chosen, photo = fallback, usable(fallback)
            break
        except ValueError:
            st.session_state.pop(K + "last", None)
    if photo is None:
        st.info("Upload a photo to begin (scikit-image's sample photos are not installed).")
        st.stop()
    if upload is not None or source == "Upload":
        st.caption(f"Showing {ui.plain(chosen[0])} until a photo is uploaded that can be read.")
label, image_key, photo_bytes = chosen

# --- Resolution, opacity, heads ------------------------------------------------------------------
options = vision.model_resolutions(model)
st.session_state.setdefault(K + "size", vision.default_resolution(model))
if st.session_state[K + "size"] not in options:
    st.session_state[K + "size"] = vision.default_resolution(model)
with st.sidebar:
    size = st.select_slider(
        "Input resolution", options, key=K + "size",
        format_func=lambda s: f"{s} px · {vision.token_count(s, cfg.patch_size, n_prefix)} tokens")
    alpha = st.slider("Overlay opacity", 0.0, 1.0, 0.55, 0.05, key=K + "alpha")

with st.expander("Switch heads off (untick a head; every view below uses the masked model)"):
    heads_key = f"{K}heads:{cfg.n_layers}x{cfg.n_heads}"   # a new model shape starts all on
    table = pd.DataFrame(True, index=[f"L{i}" for i in range(cfg.n_layers)],
                         columns=[f"H{h}" for h in range(cfg.n_heads)])
    kept = st.data_editor(table, key=heads_key, width="content", num_rows="fixed")
    st.button("All heads on", key=K + "all_on",
              on_click=lambda: st.session_state.pop(heads_key, None))
mask = torch.tensor(kept.to_numpy(dtype=bool), dtype=torch.float32)  # (L, H), 1 = on
heads_off = int((mask == 0).sum())
head_mask = mask if heads_off else None

grid_h = grid_w = size // cfg.patch_size
# Widgets whose range depends on the model or the resolution: clamp a remembered value that a
# smaller model or grid made out of range (Streamlit raises on it) before drawing them.
for name, top, default in (("layer", cfg.n_layers - 1, cfg.n_layers - 1),
                           ("q_layer", cfg.n_layers - 1, cfg.n_layers - 1),
                           ("a_layer", cfg.n_layers, cfg.n_layers - 1),
                           ("row", grid_h - 1, grid_h // 2), ("col", grid_w - 1, grid_w // 2)):
    st.session_state[K + name] = min(st.session_state.get(K + name, default), top)
with st.spinner(f"Tracing {grid_h * grid_w} patches…"):
    tr = traced(model.info.key, image_key, size, mask.numpy().tobytes(), model, photo, head_mask)
shown = vision.display_image(photo)
off = (mask == 0)[tr.layers]
st.caption(f"**{ui.plain(label)}** · {photo.width}×{photo.height} px, squeezed to {size}×{size} · "
           f"{grid_h}×{grid_w} patches of {cfg.patch_size} px · {tr.n} tokens"
           + (f" · {heads_off} heads off" if heads_off else ""))

tabs = st.tabs(["CLS → patches", "Patch query", "Rollout & saliency", "Artefact tokens",
                "Attention distance", "Head-mask effect", "Export"])
maps = vision.cls_maps(tr)                                                  # (L, H, gh, gw)
layer_ids = tr.layers

with tabs[0]:
    view = st.radio("Show", ["One layer", "Every layer × head"], key=K + "view", horizontal=True)
    if view == "One layer":
        layer = st.slider("Layer", 0, cfg.n_layers - 1, key=K + "layer")
        overlay = vision.head_overlays(shown, maps[layer:layer + 1], [layer], tile=224,
                                       alpha=alpha, off=off[layer:layer + 1])
    else:
        overlay = vision.head_overlays(shown, maps, layer_ids, tile=112, alpha=alpha, off=off)
    st.image(overlay, caption="Attention from CLS to each patch; each tile scaled to its own range")

with tabs[1]:
    cols = st.columns(3)
    row = cols[0].number_input("Patch row", 0, grid_h - 1, key=K + "row")
    col = cols[1].number_input("Patch column", 0, grid_w - 1, key=K + "col")
    q_layer = cols[2].slider("Layer", 0, cfg.n_layers - 1, key=K + "q_layer")
    query = vision.patch_query_maps(tr, int(row), int(col))                  # (L, H, gh, gw)
    marked = vision.mark_patches(shown, [(int(row), int(col))], tr.grid)
    st.image(vision.head_overlays(marked, query[q_layer:q_layer + 1], [q_layer], tile=224,
                                  alpha=alpha, off=off[q_layer:q_layer + 1]),
             caption=f"Where patch ({row}, {col}) (outlined) attends, per head of layer {q_layer}")

with tabs[2]:
    left, middle, right = st.columns(3)
    left.image(shown, caption="Photo")
    middle.image(viz.overlay_patch_map(shown, vision.rollout_map(tr, head_mask), alpha),
                 caption="Attention rollout from CLS over all layers (kept heads)")
    if tr.saliency is not None:
        right.image(viz.overlay_patch_map(shown, tr.saliency, alpha, normalise=False),
                    caption="The model's saliency output (0…1)")
    else:
        right.info("This model has no saliency decoder (only the bundled dinov2 does).")

with tabs[3]:
    cols = st.columns(2)
    a_layer = cols[0].slider(f"Hidden state: input of block … ({cfg.n_layers} = final output)",
                             0, cfg.n_layers, key=K + "a_layer")
    k = cols[1].slider("Flag norms above median + k·MAD; k =", 2.0, 20.0, vision.ARTEFACT_K, 0.5,
                       key=K + "k")
    found = vision.find_artefacts(tr, a_layer, k)
    st.image(viz.overlay_patch_map(vision.mark_patches(shown, found.patches, tr.grid),
                                   found.norms, alpha),
             caption="Hidden-state norm per patch; flagged patches outlined")
    st.write(f"Median norm {found.median:.2f}, MAD {found.mad:.2f}, threshold {found.threshold:.2f}: "
             f"**{len(found.patches)} of {grid_h * grid_w} patches flagged**. DINOv2 reuses a few "
             "low-information patches as global scratch space (Darcet et al. 2024, 'Vision "
             "Transformers Need Registers'): their hidden states have outsized norms and draw "
             "attention. The effect is strongest in large models; ViT-S/14 shows milder outliers, "
             "clearest at the last block's input.")
    if found.patches:
        st.dataframe(pd.DataFrame(
            [(r, c, float(found.norms[r, c]), float(found.robust_z[r, c])) for r, c in found.patches],
            columns=["row", "column", "norm", "MADs above median"]), hide_index=True)

with tabs[4]:
    distances = vision.attention_distance_px(tr, cfg.patch_size)
    st.plotly_chart(viz.distance_figure(distances, unit=f"px at {size} px"), key=K + "distance")
    st.caption("Attention-weighted distance between patch centres, mean over query patches, CLS "
               "left out (the ViT paper's plot, where early layers mix local and global heads "
               "and deeper layers are mostly global).")

with tabs[5]:
    if head_mask is None:
        st.info("All heads are on. Untick heads under 'Switch heads off' to see what changes.")
    else:
        before = traced(model.info.key, image_key, size, torch.ones_like(mask).numpy().tobytes(),
                        model, photo, None)
        effect = vision.mask_effect(before, tr, head_mask)
        cols = st.columns(3)
        cols[0].metric("CLS embedding cosine", f"{effect.cls_cosine:.4f}")
        if effect.saliency_iou is not None:
            cols[1].metric("Saliency IoU at 0.5", f"{effect.saliency_iou:.3f}")
            cols[2].metric("Saliency mean |change|", f"{effect.saliency_mean_abs_change:.4f}")
            pair = [before.saliency, tr.saliency]
            st.image([viz.overlay_patch_map(shown, s, alpha, normalise=False) for s in pair],
                     caption=["Saliency, all heads", f"Saliency, {heads_off} heads off"], width=300)
        rollouts = [vision.rollout_map(before), vision.rollout_map(tr, head_mask)]
        st.image([viz.overlay_patch_map(shown, r, alpha) for r in rollouts],
                 caption=["Rollout, all heads", "Rollout, heads off"], width=300)

with tabs[6]:
    # Callables: the files are built only when a button is clicked, not on every rerun.
    stem = label.rsplit(".", 1)[0]
    st.download_button("PNG: the CLS → patch overlays shown", lambda: viz.image_png(overlay),
                       f"{stem}_{size}px_cls_view.png", "image/png", key=K + "png_view")
    st.download_button(
        "PNG: every head's CLS → patch overlay",
        lambda: viz.image_png(vision.head_overlays(shown, maps, layer_ids, tile=160, alpha=alpha,
                                                   off=off)),
        f"{stem}_{size}px_heads.png", "image/png", key=K + "png")
    st.download_button(
        "NPZ: maps (CLS, query, rollout, distances, saliency, norms)",
        lambda: vision.maps_npz(tr, cfg.patch_size, head_mask=head_mask,
                                query=(int(row), int(col)), artefacts=found),
        f"{stem}_{size}px_maps.npz", "application/octet-stream", key=K + "npz")
    st.caption("The NPZ opens with `numpy.load(path)` (no pickles): cls_maps [L, H, gh, gw], "
               "query_maps, rollout, mean_distance_px [L, H], saliency, artefact norms and flags, "
               "head_mask, grid, patch_size.")

# Only a photo the whole page could be drawn from becomes the one a later bad upload falls back to.
st.session_state[K + "last"] = (label, image_key, photo_bytes)
