"""The one head-mask editor: a layer x head grid the user clicks, then one Apply.

    keep = head_editor(model.cfg, "heads", scores=imp, model_key=model.info.key, effect=live)

Arguments:
- `cfg`: the model's config (only `n_layers` and `n_heads` are read).
- `page`: the page's namespace; every key the editor writes is `names.session_key(page, ...)`,
  so two pages (Heads, Images, Lab, Translate) never share a mask.
- `scores`: optional [L, H] tensor (importance, a head score; NaN = unknown). Heads are then
  coloured by score in four bins (grey, blue, orange, red: lowest to highest quarter), and a
  "keep the top k% by <score_label>" preset appears (`analysis.importance.keep_top`); without
  scores, `score_hint` shows that preset disabled with this hint ("compute importance first").
- `model_key`: the model's catalogue key; the mask is kept per model and shape (default: shape).
- `effect`: optional callable `effect(keep)` drawn BESIDE the grid (editor left, effect right),
  where `keep` is the applied mask. It may do its heavy work first and return a callable that
  draws (then nothing of the effect is sent to the browser while the model runs); it may also
  just draw and return None.
- `link`: keep the applied mask in the page's link (`?heads=LxH-hex`, read once per session).

Every edit waits for Apply, on every page: a head click, a layer box, a preset and Reset change
only the grid; heads whose state differs from the applied mask are marked `*`, a note under the
grid counts the pending changes, Apply commits them all in one run (the page's effect runs once)
and "Discard" puts the grid back to the applied mask. One rule everywhere, because a control that
applies at once on one page and waits on another loses the user (and some effects take seconds).
A layer with some heads on says so in its box's label ("layer 3 ◐"), and a head that is off
is struck through (~~h3~~), so a coloured head (an alignment head) that is off still looks off.

Returns the applied mask: a fresh float tensor [L, H], 1 = on, 0 = off. The state is per browser
session (st.session_state) and per model; the shared model is never touched.

Speed (bench/toggle_latency.py: head click to painted result under 1 s on SmolLM2): a head click
reruns only the grid (a fragment: one multi-select row per layer, 30 widgets for SmolLM2 rather
than 270 checkboxes), edits pile up there; a layer box or a preset changes the grid and reruns the
page (the effect is then its cached one); Apply and Discard rerun the page.

Keys (for tests and links): row `<page>.row:<model>:<layer>` (the list of heads on), layer box
`<page>.layer:<model>:<layer>`, `<page>.apply`, `<page>.reset`, `<page>.top`, `<page>.random`,
`<page>.only_btn`, `<page>.only:<model>` (layer), `<page>.share` (k, % kept), `<page>.seed`,
`<page>.discard`, `<page>.settled`,
applied mask `<page>.applied:<model>` (an `encode_mask` string); also `<page>.saved:<model>`,
`<page>.link_read`, `<page>.rerun_page`. A view must not use these names for its own widgets.
"""
from __future__ import annotations

from typing import Callable

import streamlit as st
import torch

from attnviz.analysis import head_ablation, importance
from attnviz.analysis.pruning import decode_mask, encode_mask
from attnviz.base import names
from attnviz.ui.common import plain

PARTIAL = "◐"   # a layer box's mark for "some of this layer's heads are on" (a checkbox has no third state)
SCORE_COLOURS = ("gray", "blue", "orange", "red")  # lowest .. highest quarter of the known scores
LAYER_BOX_PX = 100  # "layer 29 ◐" in the grid's small type, never cut to "lay…" in a narrow column
# Tighter rows than Streamlit's default (1 rem between elements): 30 layers fit one screen.
_CSS = """<style>
.st-key-{page}-head-grid {{gap: 0.1rem;}}
.st-key-{page}-head-grid [data-testid="stHorizontalBlock"] {{gap: 0.3rem;}}
.st-key-{page}-head-grid [data-testid="stButtonGroup"] > div {{gap: 0.15rem;}}
.st-key-{page}-head-grid [data-testid="stButtonGroup"] button {{min-height: 1.35rem; height: 1.35rem;
  padding: 0 0.4rem; font-size: 0.8rem;}}
.st-key-{page}-head-grid [data-testid="stCheckbox"] label {{min-height: 1.35rem; font-size: 0.8rem;}}
</style>"""


class Editor:
    """The keys and session state of one page's editor for one model."""

    def __init__(self, cfg, page: str, model_key: str = ""):
        self.L, self.H, self.page = int(cfg.n_layers), int(cfg.n_heads), page
        self.model = f"{model_key}:{self.L}x{self.H}" if model_key else f"{self.L}x{self.H}"

    def key(self, name: str) -> str:
        return names.session_key(self.page, name)

    def row_key(self, layer: int) -> str:
        return self.key(f"row:{self.model}:{layer}")

    def layer_key(self, layer: int) -> str:
        return self.key(f"layer:{self.model}:{layer}")

    @property
    def applied_key(self) -> str:
        return self.key(f"applied:{self.model}")

    @property
    def saved_key(self) -> str:
        return self.key(f"saved:{self.model}")

    def grid(self) -> torch.Tensor:
        """BoolTensor [L, H]: the grid as it stands, edits not yet applied included."""
        keep = torch.zeros(self.L, self.H, dtype=torch.bool)
        for i in range(self.L):
            keep[i, [int(h) for h in st.session_state[self.row_key(i)]]] = True
        return keep

    def applied(self) -> torch.Tensor:
        return decode_mask(st.session_state[self.applied_key], self.L, self.H)

    def apply(self):
        st.session_state[self.applied_key] = encode_mask(self.grid())

    def set_grid(self, keep):
        keep = torch.as_tensor(keep, dtype=torch.bool)
        for i in range(self.L):
            st.session_state[self.row_key(i)] = [h for h in range(self.H) if keep[i, h]]

    def set_mask(self, keep):
        """Presets, layer boxes and links: the grid and the applied mask at once."""
        self.set_grid(keep)
        st.session_state[self.applied_key] = encode_mask(torch.as_tensor(keep, dtype=torch.bool))

    def preset(self, keep):
        """A preset's mask: a pending edit of the grid, like any other."""
        self.set_grid(keep)

    def settle(self, apply: bool):
        """Staged Apply (the grid becomes the applied mask) or Discard (the grid goes back to it)."""
        if apply:
            self.apply()
        else:
            self.set_grid(self.applied())
        st.session_state[self.key("settled")] = True

    def pending(self) -> torch.Tensor:
        """BoolTensor [L, H]: heads whose state in the grid is not the applied one."""
        return self.grid() != self.applied()

    def layer_changed(self, layer: int):
        """A layer box sits in the grid, whose clicks rerun the grid alone: it asks for the page (the
        browser keeps a row's old heads when the server sets them in a run of the grid alone).
        One more pending edit: the page's effect is then its cached one. A partial layer's box reads
        unticked, so a click on it switches the whole layer on."""
        st.session_state[self.row_key(layer)] = list(range(self.H)) if st.session_state[self.layer_key(layer)] else []
        st.session_state[self.key("rerun_page")] = True

    def restore(self, link: bool):
        """Defaults on a first draw; Streamlit drops a widget's state on runs that do not draw it
        (another page, another model): a plain copy of the grid restores it when the user is back."""
        ss = st.session_state
        saved = None
        if self.saved_key in ss:
            try:
                saved = decode_mask(ss[self.saved_key], self.L, self.H)
            except ValueError:
                saved = None
        for i in range(self.L):
            ss.setdefault(self.row_key(i), [h for h in range(self.H) if saved is None or saved[i, h]])
        ss.setdefault(self.applied_key, encode_mask(self.grid()))
        if link and not ss.get(self.key("link_read")):  # the mask in a shared link, read once
            ss[self.key("link_read")] = True
            if "heads" in st.query_params:
                try:
                    self.set_mask(decode_mask(st.query_params["heads"], self.L, self.H))
                except ValueError as err:
                    st.warning(plain(str(err)))


def score_labels(scores, n_layers: int, n_heads: int) -> list[list[str]]:
    """Per head, its pill label: `h3`, coloured by the quarter its score falls in (NaN: plain)."""
    plain_labels = [[f"h{h}" for h in range(n_heads)] for _ in range(n_layers)]
    if scores is None:
        return plain_labels
    scores = torch.as_tensor(scores, dtype=torch.float32)
    if tuple(scores.shape) != (n_layers, n_heads):
        raise ValueError(f"scores are {tuple(scores.shape)}, the model has {n_layers} x {n_heads} heads")
    known = scores[~torch.isnan(scores)]
    if known.numel() == 0:
        return plain_labels
    edges = torch.quantile(known, torch.tensor([0.25, 0.5, 0.75]))
    out = []
    for i in range(n_layers):
        row = []
        for h in range(n_heads):
            value = scores[i, h]
            if torch.isnan(value):
                row.append(f"h{h}")
            else:
                row.append(f":{SCORE_COLOURS[int((value > edges).sum())]}[h{h}]")
        out.append(row)
    return out


def presets(ed: Editor, scores, score_label: str, score_hint: str | None):
    """Reset, top k% by score, random k%, one layer only: each sets the grid, waiting for Apply."""
    ss = st.session_state
    left, right = st.columns(2)
    right.button("Reset: all heads on", key=ed.key("reset"), on_click=ed.preset,
                 args=(torch.ones(ed.L, ed.H, dtype=torch.bool),))
    with left.popover("Presets", help="set the whole mask at once (waits for Apply)"):
        share = st.slider("k (% of heads kept)", 5, 100, 70, 5, key=ed.key("share"))
        if scores is not None or score_hint:
            st.button(f"Keep top k% by {score_label}", key=ed.key("top"), disabled=scores is None,
                      help=score_hint if scores is None else None, on_click=lambda: ed.preset(
                          importance.keep_top(torch.as_tensor(scores, dtype=torch.float32), share / 100)))
        seed = st.number_input("seed", 0, 10_000, 0, key=ed.key("seed"))
        n_keep = max(1, round(share / 100 * ed.L * ed.H))
        st.button("Keep a random k%", key=ed.key("random"), on_click=lambda: ed.preset(
            (torch.randperm(ed.L * ed.H, generator=torch.Generator().manual_seed(int(seed))) < n_keep)
            .view(ed.L, ed.H)))
        only_key = ed.key(f"only:{ed.model}")
        if ss.get(only_key, 0) >= ed.L:
            ss[only_key] = ed.L - 1
        only = st.selectbox("layer", range(ed.L), index=ed.L - 1, key=only_key)
        st.button("Keep this layer only", key=ed.key("only_btn"),
                  on_click=lambda: ed.preset([[i == only] * ed.H for i in range(ed.L)]))


def metric_delta(change: float, text: str, better: str, places: int = 2) -> dict:
    """st.metric's delta arguments for a change a mask makes: the arrow follows the
    change's sign, the colour whether it is good (`better`: "higher" or "lower" is good) — not
    the sign of the text; a change that rounds to zero at `places` decimals is grey, no arrow."""
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    if round(change, places) == 0:
        return dict(delta=text, delta_color="off", delta_arrow="off")
    good = (change > 0) == (better == "higher")
    return dict(delta=text, delta_color="green" if good else "red", delta_arrow="up" if change > 0 else "down")


def off_list(keep: torch.Tensor, limit: int = 12) -> str:
    """The heads that are off, by name (`L1H2, L4H7`), at most `limit` of them."""
    off = [names.head_name(i, h) for i, h in (~keep).nonzero().tolist()]
    shown = ", ".join(off[:limit])
    return shown + (f" and {len(off) - limit} more" if len(off) > limit else "")


def layer_label(layer: int, on: int, n_heads: int) -> str:
    """A layer box's label: a partial layer says how many of its heads are on (a checkbox has no
    third state, and an empty box read as "this layer is off")."""
    return f"layer {layer}" if on in (0, n_heads) else f"layer {layer} {PARTIAL}"


def head_label(label: str, on: bool, pending: bool) -> str:
    """A pill's label: struck through when the head is off in the grid, `*` while it waits for Apply."""
    return (label if on else f"~~{label}~~") + ("\\*" if pending else "")


@st.fragment
def grid_part(ed: Editor, labels, scores, score_label: str):
    """The clickable grid; a head click reruns only this part."""
    ss = st.session_state
    if ss.pop(ed.key("rerun_page"), False):  # a layer box changed the grid: the whole page redraws it
        st.rerun()
    st.html(_CSS.format(page=ed.page))
    pending = ed.pending()
    with st.container(key=f"{ed.page}-head-grid"):
        current = ed.grid()
        for i in range(ed.L):
            on = int(current[i].sum())
            ss[ed.layer_key(i)] = on == ed.H
            row = st.container(horizontal=True, vertical_alignment="center", gap=None)
            # a widget's label is not part of its identity (its key is): the label may follow the state
            row.checkbox(layer_label(i, on, ed.H), key=ed.layer_key(i), on_change=ed.layer_changed, args=(i,),
                         width=LAYER_BOX_PX)
            row.pills(f"heads on in layer {i}", range(ed.H), selection_mode="multi", key=ed.row_key(i),
                      format_func=lambda h, r=labels[i], c=current[i].tolist(), p=pending[i].tolist():
                      head_label(r[h], c[h], p[h]), label_visibility="collapsed")
    grid = ed.grid()
    ss[ed.saved_key] = encode_mask(grid)
    legend = (f" Colour: {plain(score_label)}, lowest to highest quarter: grey, blue, orange, red."
              if scores is not None else "")
    pending_controls(ed, grid, legend)


def pending_controls(ed: Editor, grid: torch.Tensor, legend: str):
    """The pending edits counted, Apply (the page runs its effect once) and Discard."""
    n = int(ed.pending().sum())
    note = (f"**{n} pending change{'s' if n != 1 else ''}** (marked \\*, not applied yet: press Apply)"
            if n else "No pending changes: the result beside the grid is for this grid.")
    st.caption(f"{note} · The grid has {int(grid.sum())} heads on. Highlighted = on; a layer box switches "
               f"its whole layer ({PARTIAL}: some of its heads on); struck through = off; every edit waits for Apply.{legend}"
               + (f" Off: {off_list(grid)}." if not grid.all() else ""))
    left, right = st.columns(2)
    left.button("Apply", key=ed.key("apply"), type="primary", disabled=not n, help="every pending edit in one run",
                on_click=ed.settle, args=(True,))
    right.button("Discard", key=ed.key("discard"), disabled=not n, help="put the grid back to the mask applied last",
                 on_click=ed.settle, args=(False,))
    # a button drawn disabled (nothing pending once its callback ran) reads False though it was just
    # clicked: the callback's flag says so. The page reruns: Apply's effect, and the rows Discard set
    # (the browser keeps a row's old heads when they are set in a run of the grid alone)
    if st.session_state.pop(ed.key("settled"), False):
        st.rerun()


@st.fragment
def effect_part(ed: Editor, effect: Callable, link: bool):
    """The live effect of the applied mask (Apply sits under the grid, by its pending note)."""
    keep = ed.applied()
    draw = effect(keep.float())  # heavy work first, before anything of this part is drawn
    if link:
        if keep.all():   # written only on a change: a write resends the whole query string
            if "heads" in st.query_params:
                del st.query_params["heads"]
        elif st.query_params.get("heads") != encode_mask(keep):
            st.query_params["heads"] = encode_mask(keep)
    st.caption(f"{int(keep.sum())} of {ed.L * ed.H} heads on · the mask is yours alone"
               + (" and lives in this page's link" if link else ""))
    if callable(draw):
        draw()


def head_editor(cfg, page: str, scores=None, *, model_key: str = "", effect: Callable | None = None,
                link: bool = False, score_label: str = "score", score_hint: str | None = None,
                split=(2, 3)) -> torch.Tensor:
    """Draw the editor (and `effect` beside it); return the applied mask [L, H] float, 1 = on.
    See the module docstring for the arguments and the keys."""
    ed = Editor(cfg, page, model_key)
    ed.restore(link)
    labels = score_labels(scores, ed.L, ed.H)
    if effect is None:
        presets(ed, scores, score_label, score_hint)
        grid_part(ed, labels, scores, score_label)
        return ed.applied().float()
    left, right = st.columns(list(split), gap="medium")
    with left:
        presets(ed, scores, score_label, score_hint)
        grid_part(ed, labels, scores, score_label)
    with right:
        effect_part(ed, effect, link)
    return ed.applied().float()


def applied_mask(cfg, page: str, model_key: str = "") -> torch.Tensor:
    """The mask last applied in this page's editor (all on before the editor is first drawn)."""
    ed = Editor(cfg, page, model_key)
    if ed.applied_key not in st.session_state:
        return torch.ones(ed.L, ed.H)
    return ed.applied().float()


def set_applied(cfg, page: str, keep, model_key: str = ""):
    """Set grid and applied mask at once (a preset computed by the page, e.g. from a file)."""
    Editor(cfg, page, model_key).set_mask(keep)


def ablation_choice(key: str, mean_over: str, note: str = "") -> str:
    """How a heads-off view removes a switched-off head: "zero" or "mean" (its mean output over
    `mean_over` with every head on). One radio for every page that offers both."""
    return st.radio("Heads switched off are removed by", head_ablation.MODES, key=key, horizontal=True,
                    format_func=lambda m: f"{m} ablation",
                    help=f"zero: a head off outputs 0 (what pruning does); mean: it outputs its mean over "
                         f"{mean_over}, every head on.{note}")


def mask_key(mask, fill=None) -> bytes:
    """The bytes a cached result of a head mask (and a mean ablation's fill) is keyed on."""
    return (b"" if mask is None else mask.numpy().tobytes()) + (b"" if fill is None else fill.numpy().tobytes())
