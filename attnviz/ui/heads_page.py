"""The Heads page: switch heads off and watch the outputs change; rank heads; pruning curves; real pruning.

The mask comes from the one head editor (`attnviz.ui.head_editor`), with the live effect beside it.
Below, one tool at a time (importance, pruning curve, real pruning, a run over a corpus): only the
chosen one runs.
"""
from __future__ import annotations

import streamlit as st

from attnviz.analysis import effects, head_ablation, head_answers, importance, pruning
from attnviz.base.limits import LIMITS
from attnviz.base.names import session_key
from attnviz.figures import head_figures
from attnviz.ui import common
from attnviz.ui import shared_view
from attnviz.weights.catalogue import list_models
from attnviz.ui.head_editor import ablation_choice, applied_mask, head_editor, metric_delta
from attnviz.ui.heads_corpus import corpus_tool
from attnviz.ui.heads_tools import tools
from attnviz.ui.readouts_page import head_means

PAGE = "heads"
TASKS = ("encoder", "lm")
LIVE_CHARTS = ("next token", "per-token loss", "attention change", "all three")
# Streamlit's chart theme is applied in the browser on every redraw (~0.1-0.3 s of the live view's
# redraw, bench/toggle_latency.py): the live charts keep plotly's own look.
LIVE_THEME = dict(theme=None)
SENTENCES = ["A kitten is resting on a rug.", "The dog sleeps on the sofa.", "A man is playing a guitar.",
             "Stock markets fell sharply today.", "The cat is lying on a carpet."]
# Bounds of the typed boxes: a token box holds one token, so a few dozen characters
# are plenty; the ranking sentences are short sentences, not documents.
TOKEN_BOX_CHARS = effects.TOKEN_CHARS  # the library refuses longer before tokenising, too
SENTENCE_LINES, SENTENCE_CHARS = 20, 300
MESSAGE_CHARS = 300   # a warning quotes at most this much of what the user typed


def K(name: str) -> str:
    return session_key(PAGE, name)


def short(message: str, limit: int = MESSAGE_CHARS) -> str:
    message = str(message)
    return message if len(message) <= limit else message[:limit] + "…"


@st.cache_resource(max_entries=LIMITS.trace_cache_entries, show_spinner=False)
def full_outputs(_model, key, ids, layer, sentences):
    """The unmasked side depends only on the text: shared by every session, never mutated."""
    return effects.outputs(_model, list(ids), None, layer, list(sentences))


@st.cache_data(max_entries=64, show_spinner=False)
def encoded(key: str, text: str, _model) -> tuple[tuple[int, ...], int] | str:
    """(the first live_max_tokens ids, how many the text has) or the reason it cannot be used,
    once per model and text: a live rerun (a chart choice, Apply) does not tokenize again."""
    try:
        ids = _model.encode_text(text)[0]
    except ValueError as err:
        return short(err)
    return tuple(ids[:LIMITS.live_max_tokens].tolist()), len(ids)


@st.cache_data(max_entries=256, show_spinner=False)
def typed_token(key: str, typed: str, _model) -> tuple[int | None, str | None]:
    """(token id, note) or (None, short reason), once per model and typed text."""
    if len(typed) > TOKEN_BOX_CHARS:
        return None, f"{len(typed):,} characters are far more than one token"
    try:
        return effects.single_token(_model.tokenizer, typed)
    except ValueError as err:
        return None, short(err)


@st.cache_data(max_entries=64, show_spinner=False)
def sentence_list(typed: str) -> tuple[tuple[str, ...], str | None]:
    """The ranking sentences: at most SENTENCE_LINES non-empty lines of SENTENCE_CHARS each."""
    lines = [s.strip() for s in typed.splitlines() if s.strip()]
    cut = [s[:SENTENCE_CHARS] for s in lines[:SENTENCE_LINES]]
    note = None
    if len(lines) > SENTENCE_LINES or any(len(s) > SENTENCE_CHARS for s in lines):
        note = (f"Ranking the first {SENTENCE_LINES} sentences, each cut to {SENTENCE_CHARS} characters "
                f"(of {len(lines)}).")
    return tuple(cut), note


class View:
    """One model's Heads page in one run."""

    def __init__(self, model):
        self.model, self.cfg = model, model.cfg
        self.L, self.H, self.mkey = model.cfg.n_layers, model.cfg.n_heads, model.info.key
        self.shape = f"{self.mkey}:{self.L}x{self.H}"  # settings naming a layer or head: per model
        self.lm = model.next_token
        self.text = ""
        self.ablation = "zero"  # how the mask's heads are removed: zero | mean (analysis.ablation)

    def chosen_token(self, column, label, key, fallback: int, fallback_name: str, placeholder: str):
        """A token the user typed (one token, or a message saying how it tokenizes), else the fallback."""
        typed = column.text_input(label, key=key, placeholder=placeholder, max_chars=TOKEN_BOX_CHARS)
        if not typed.strip():
            return fallback
        token, note = typed_token(self.mkey, typed, self.model)
        if token is None:
            column.warning(common.plain(note) + f" — showing {common.plain(fallback_name)} instead.")
            return fallback
        if note:
            column.caption(common.plain(note))
        return token

    def last_position_view(self, full, masked):
        tok = self.model.tokenizer
        top = full.logprobs[-1].topk(2).indices.tolist()
        names = effects.token_names(tok, top)
        t1, t2, t3 = st.columns([1, 1, 2])
        target = self.chosen_token(t1, "target token", K(f"target:{self.mkey}"), top[0], names[0],
                                   f"e.g. ' Mary' — empty: {names[0]}")
        other = self.chosen_token(t2, "minus token (logit difference)", K(f"other:{self.mkey}"), top[1],
                                  names[1], f"e.g. ' John' — empty: {names[1]}")
        nums = effects.last_position(full, masked, target, other)
        # quoted: a label's word space is part of the token (' Paris' and 'Paris' are two tokens)
        tn, on = (f"'{common.plain(n)}'" for n in effects.token_names(tok, [target, other]))
        points = 100 * (nums['prob_masked'] - nums['prob_full'])
        t3.metric(f"P({tn}) next, masked", f"{nums['prob_masked']:.1%}", **metric_delta(
            points, f"{points:+.1f} pts vs full {nums['prob_full']:.1%}", "higher", 1))
        change = nums['logit_diff_masked'] - nums['logit_diff_full']
        t3.metric(f"logit({tn}) − logit({on}), masked", f"{nums['logit_diff_masked']:+.3f}", **metric_delta(
            change, f"{change:+.3f} vs full {nums['logit_diff_full']:+.3f}", "higher", 3))
        pf, pm = effects.token_names(tok, [nums["top1_full"], nums["top1_masked"]])
        if nums["flipped"]:
            st.warning(f"The next-token prediction flips: the full model predicts {common.plain(pf)}, the "
                       f"masked model {common.plain(pm)}. Perplexity alone can hide this.", icon="⚠️")
        else:
            st.caption(f"The next-token prediction stays {common.plain(pf)}.")

    def live_runs(self, keep):
        """The full and the masked run of the live view, or a message. Both runs happen before
        anything of the live view is drawn: the browser then has nothing to repaint while the model
        runs (on a small machine the two compete for the same cores). The pickers' values come from
        the session state, where Streamlit keeps them between runs."""
        ss = st.session_state
        got = encoded(self.mkey, self.text, self.model)
        if isinstance(got, str):
            return got
        ids, n_ids = got
        layer = ss.get(K(f"diff_layer:{self.shape}"), self.L - 1)
        note = None
        sentences = ()
        if not self.lm:
            sentences, note = sentence_list(ss.get(K("sentences"), "\n".join(SENTENCES)))
        full = full_outputs(self.model, self.mkey, ids, layer, sentences)
        cache_key = (self.mkey, ids, layer, sentences, pruning.encode_mask(keep), self.ablation)
        previous = ss.get(K("masked"))  # one entry, this session only
        if previous is None or previous[0] != cache_key:
            # the run starts at the first layer whose mask differs from the full or the previous run
            bases = [full] + ([previous[1]] if previous is not None and previous[0][:4] == cache_key[:4] else [])
            ss[K("masked")] = (cache_key, effects.outputs(self.model, list(ids), keep.float(), layer,
                                                         list(sentences), base=bases, ablation=self.ablation,
                                                         means=self.means()))
        return ids, n_ids, layer, sentences, note, full, ss[K("masked")][1]

    def means(self):
        """The heads' means over the evaluation text when heads are mean-ablated (once per model)."""
        return head_means(self.model) if self.ablation == "mean" else None

    def live(self, mask):
        """The head editor's effect: runs now, returns the drawing (see head_editor)."""
        keep = mask.bool()
        if not keep.any():
            return lambda: st.error("Every head is switched off: nothing is left to compare or prune. Turn "
                                    "at least one head back on (or press Reset under Presets); importance "
                                    "and pruning curves below still work.")
        runs = self.live_runs(keep)
        return lambda: self.live_effect(keep, runs)

    def live_effect(self, keep, runs):
        if isinstance(runs, str):
            st.warning(common.plain(runs))
            return
        ids, n_ids, layer, sentences, note, full, masked = runs
        st.caption(f"Heads off: {head_ablation.describe(masked.ablation)}.")
        if n_ids > LIMITS.live_max_tokens:
            st.caption(f"The live view uses the first {LIMITS.live_max_tokens} of {n_ids} tokens.")
        if self.lm:
            # Each plotly chart adds to every redraw: one appears 0.6–0.7 s after Apply, all three
            # 0.9–1.1 s (bench/toggle_latency.py, SmolLM2 at 64 tokens). Its own row: its four
            # choices did not fit half of this column and the last was cut at the page's edge.
            chart = st.segmented_control("chart", default=LIVE_CHARTS[0], required=True,
                                         **shared_view.linked(K("chart"), options=LIVE_CHARTS), help="the chart redrawn after each Apply; "
                                         "all three take about 0.3–0.5 s longer to appear")
        c1, c2, c3 = st.columns([1, 1, 2])
        c1.selectbox("layer for the attention change", index=self.L - 1,
                     **shared_view.linked(K(f"diff_layer:{self.shape}"), options=range(self.L)))
        head = c2.selectbox("head", **shared_view.linked(K(f"diff_head:{self.shape}"), options=range(self.H)))
        if not self.lm:
            chart = "attention change"
            c3.text_area("sentences to rank by similarity (one per line)", "\n".join(SENTENCES),
                         key=K("sentences"), max_chars=SENTENCE_LINES * (SENTENCE_CHARS + 1),
                         help=f"at most {SENTENCE_LINES} sentences of {SENTENCE_CHARS} characters")
            if note:
                c3.caption(note)
        cmp = effects.output_change(full, masked, list(sentences))
        off = int((~keep).sum())
        st.info(head_answers.mask_sentence(off, self.L * self.H, "top1", cmp["top1"], 1.0, cmp["flipped_positions"], len(ids))
                if self.lm else head_answers.mask_sentence(off, self.L * self.H, "cosine", cmp["cosine"], 1.0))
        if self.lm:
            self.lm_numbers(cmp, ids, full, masked, chart)
        else:
            change = cmp['cosine'] - 1
            st.metric("embedding cosine to the full model", f"{cmp['cosine']:.4f}", **metric_delta(
                change, "= full" if round(change, 4) == 0 else f"{change:+.4f} vs full 1", "higher", 4))
            if "ranking" in cmp:
                st.caption(f"Similarity ranking of the sentences to the text: {cmp['rank_changes']} "
                           "sentence(s) change rank under the mask.")
                st.dataframe(cmp["ranking"], hide_index=True, key=K("ranking"))
        if chart in ("attention change", "all three"):
            st.plotly_chart(head_figures.difference_heatmap(
                full.attention[head], masked.attention[head], full.tokens, causal=self.cfg.causal,
                title=f"layer {layer}, head {head}: attention masked − full"), key=K("diff"), **LIVE_THEME)
            note = effects.attention_note(keep, layer)
            if note:
                st.caption(note)

    def lm_numbers(self, cmp, ids, full, masked, chart):
        tok = self.model.tokenizer
        m1, m2, m3 = st.columns(3)
        change = cmp['perplexity_masked'] - cmp['perplexity_full']
        m1.metric("perplexity (masked)", f"{cmp['perplexity_masked']:.2f}", **metric_delta(
            change, f"{change:+.2f} vs full {cmp['perplexity_full']:.2f}", "lower"))
        m2.metric("KL(full ‖ masked), nats/token", f"{cmp['kl']:.4f}")
        flips = cmp["flipped_positions"]
        m3.metric("top-1 agreement with the full model", f"{cmp['top1']:.1%}", **metric_delta(
            -flips, f"{flips} of {len(ids)} positions flip" if flips else "no position flips", "higher", 0))
        self.last_position_view(full, masked)
        if chart in ("next token", "all three"):
            st.plotly_chart(head_figures.topk_pair(full.top_k(10, tok), masked.top_k(10, tok)),
                            key=K("topk"), **LIVE_THEME)
        if chart in ("per-token loss", "all three"):
            if len(ids) < 2:
                st.info("Type at least two tokens to see the per-token loss and the perplexity.")
            else:
                st.plotly_chart(head_figures.token_loss_figure(full.tokens, full.token_loss, masked.token_loss),
                                key=K("token_loss"), **LIVE_THEME)


def pick_model():
    """The sidebar's picker; a shared link opens on its model (first visit only)."""
    ss = st.session_state
    linked = st.query_params.get("model")
    if K("link_model_read") not in ss:
        ss[K("link_model_read")] = True
        if linked in {m.key for m in list_models() if m.task in TASKS}:
            ss.setdefault(f"{common.MODEL_KEY}:{'/'.join(TASKS)}", linked)
    return common.model_picker(tasks=TASKS)


def page():
    """The whole page below its title."""
    model = pick_model()
    if model is None:
        st.stop()
    view = View(model)
    st.query_params["model"] = view.mkey
    default_text = ("The capital of France is Paris. The cat sat on the mat because it was tired, and"
                    if view.lm else "The cat sits on the mat.")
    text_key = K(f"text:{'lm' if view.lm else 'enc'}")
    st.session_state.setdefault(text_key, shared_view.seed_text(text_key) or default_text)
    view.text = st.text_area("Text", key=text_key, height=80, max_chars=LIMITS.max_text_chars)
    shared_view.keep_text(text_key, view.text, default_text)
    view.ablation = ablation_choice(K("ablation"), "the evaluation text",
                                    " Used by the live effect, importance and pruning curves.")
    stored = st.session_state.get(K(f"imp:{view.mkey}"))
    scores = None if stored is None else stored[0].ranking(st.session_state.get(K("imp_norm"), True))
    head_editor(model.cfg, PAGE, scores, model_key=view.mkey, effect=view.live, link=True,
                score_label="importance", score_hint="compute importance below first")
    # the tools below work on the mask the results above are for
    tools(view, applied_mask(model.cfg, PAGE, view.mkey).bool(), more={"Corpus": corpus_tool})
    shared_view.share_bar(PAGE)
