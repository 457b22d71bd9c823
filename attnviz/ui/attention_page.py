"""The Attention page: paste text, see every layer x head at once, pick a head, then one chosen
view of it (`attention_views.VIEWS`). The capture of the text and the overview are drawn on every
run; a view's own work (statistics, rollout, ranking, figures) runs only while it is chosen."""
from __future__ import annotations

import streamlit as st

from attnviz.analysis.capture import TextCapture, capture_text, truncation_message, window_size
from attnviz.analysis.guided_steps import REFERENT
from attnviz.base import texts
from attnviz.base.limits import LIMITS
from attnviz.core import tokens
from attnviz.figures import attention_figures
from attnviz.figures import render
from attnviz.ui import attention_views
from attnviz.ui import common
from attnviz.ui import job_controls
from attnviz.ui import shared_view
from attnviz.ui.attention_views import PAGE, Shown, key
from attnviz.weights import catalogue

DEFAULT_TEXT = "The animal didn't cross the street because it was too tired."
# Find heads opens on a pair a real head shows: the pronoun and the noun it refers to (the Lab's
# step-by-step opens on the same pair's head), in English or in the Chinese samples; a noun split
# over several tokens is keyed on the token that completes it (SmolLM2's 果 of 苹果).
DEFAULT_PAIRS = (REFERENT, ("它", "苹果"), ("它", "花瓶"), ("它", "动物"), ("它", "奖杯"), ("爱", "love"))
OWN = "(your own text)"


def capture(model, model_id: str, text: str, start: int) -> TextCapture:
    """The capture of ``text``: from the shared store, or made now under a progress bar. The work
    runs outside any st.cache_* function, so the bar is live and never replayed from a cache;
    each bar update is also where Streamlit's Stop (or a new Run) interrupts a long scan.
    Tensors are shared as they are (cache_data would pickle up to 128 MB on every rerun); nothing
    downstream mutates a capture."""
    store = common.shared_cache("attention.captures", LIMITS.trace_cache_entries, LIMITS.result_cache_mb)
    cache_key = (model_id, text, start)
    cap = store.get(cache_key)
    if cap is None:
        window = window_size(model.cfg.n_layers, model.cfg.n_heads)
        bar = st.progress(0.0, text="Running the model…")
        note = (" A long text is scanned layer by layer to keep memory bounded; press Stop, or "
                "Run another text, to cancel." if len(text) > 4 * window else "")

        def report(done: int, total: int):
            bar.progress(done / total, text=f"Running the model: layer {done} of {total}.{note}")

        try:
            cap = capture_text(model, text, start=start, progress=report,
                                      max_cell=attention_figures.overview_cells(model.cfg.n_layers),
                                      cancel=job_controls.session_cancel())  # a closed tab stops the scan
        finally:
            bar.empty()
        store.put(cache_key, cap)
    return cap


@st.cache_data(max_entries=16, show_spinner=False)
def vocabulary_warning(model_id: str, text: str, _model) -> str | None:
    return tokens.vocabulary_warning(_model.tokenizer, text, _model.info.key)


def readers_note(model, text: str) -> str:
    """For a model that loses this text to [UNK]: the bundled models that read its script."""
    if tokens.tokenizer_kind(model.tokenizer) == "bytelevel":
        return ""
    script = tokens.main_script(text)
    # models whose vocabulary has the script before those that spell it in bytes
    others = sorted((k for k in catalogue.text_readers(script) if k != model.info.key),
                    key=lambda k: "*" in catalogue.BUNDLED[k]["scripts"])
    if not others:
        return ""
    words = tokens.SCRIPT_WORDS.get(script, f"{script} script")
    how = [f"{k} (its byte-level tokenizer spells every character in UTF-8 bytes)"
           if "*" in catalogue.BUNDLED[k]["scripts"] else k for k in others]
    named = how[0] if len(how) == 1 else ", ".join(how[:-1]) + " and " + how[-1]
    return (f" Of the bundled models, {named} read{'s' if len(others) == 1 else ''} "
            f"{words} with no [UNK]: choose {'it' if len(others) == 1 else 'one'} in the sidebar's "
            "Model picker.")


def use_sample():
    ss = st.session_state
    if ss[key("sample")] != OWN:     # a picked sample runs at once
        ss[key("text_input")] = ss[key("text")] = ss[key("sample")]


def text_input(cfg):
    """The sample picker and the text form; a Run with an empty box keeps the previous text."""
    ss = st.session_state
    st.selectbox("Sample sentences", **shared_view.linked(key("sample"), options=[OWN] + texts.seed_sentences()),
                 on_change=use_sample)
    with st.form(key("form")):
        st.text_area("Text", key=key("text_input"), height=100,
                     help=f"Up to {min(cfg.max_positions, LIMITS.max_capture_tokens):,} tokens; "
                          "longer text is cut to fit.")
        submitted = st.form_submit_button("Run", type="primary")
    if submitted:
        if ss[key("text_input")].strip():
            ss[key("text")] = ss[key("text_input")]
        else:
            st.warning("Type or paste some text, then press Run. "
                       "The result below is for the previous text.")


def captured(model, model_id: str) -> TextCapture:
    """The capture of the current text; on an error (too long for the time limit, server busy,
    bad input) the message and the last text that worked."""
    ss = st.session_state
    try:
        cap = capture(model, model_id, ss[key("text")], ss.get(key("start"), 0))
        ss[key("good")], ss[key("good_start")] = ss[key("text")], ss.get(key("start"), 0)
    except ValueError as err:
        st.error(common.plain(f"{err} (showing the previous text instead)"))
        ss[key("text")] = ss[key("good")]
        try:
            cap = capture(model, model_id, ss[key("good")], ss[key("good_start")])
        except ValueError:
            st.stop()
    return cap


def notes(model, model_id: str, cap: TextCapture):
    """Truncation, vocabulary and window notes, the window start, and the text's tokens."""
    ss = st.session_state
    if (cut := truncation_message(cap, model.cfg.max_positions)):
        st.warning(cut)
    if model.tokenizer is not None and (oov := vocabulary_warning(model_id, ss[key("text")], model)):
        st.warning(common.plain(oov + readers_note(model, ss[key("text")])))
    if not cap.full:
        st.info(f"{cap.n:,} tokens. The overview pools the whole text; the detail views, "
                f"statistics and rollout use the {cap.size} tokens from position {cap.start} (rows "
                "renormalised inside the window), so memory stays bounded.")
        ss[key("start")] = cap.start     # the clipped start the capture actually used
        st.number_input("Window start (token)", 0, cap.n - cap.size, step=max(1, cap.size // 2),
                        key=key("start"))
    st.caption(f"{cap.n:,} tokens: "
               + common.plain(" · ".join(render.visible_token(t) for t in cap.tokens[:200]))
               + (" …" if cap.n > 200 else ""))
    held = tokens.several_characters(cap.tokens[:200], cap.special[:200].tolist())
    if held:
        st.caption(common.plain(f"{len(held)} of these tokens hold several characters each: "
                                + ", ".join(f"{text} ({count})" for _, text, count in held[:12])
                                + (" …" if len(held) > 12 else "") + ". Each is one row and one column "
                                "of every attention map."))


def follow_text(model_id: str, cap: TextCapture) -> list[int]:
    """Token choices belong to one text (and window). On a new one they are SET to their defaults,
    never popped: a popped key leaves the browser showing the old label ("After position 50: .")
    while the page uses the default; an assigned value is sent to the browser. Returns the
    window's content (non-special) positions."""
    text = st.session_state[key("text")]
    content = [i for i, special in enumerate(cap.special[cap.start: cap.start + cap.size].tolist())
               if not special] or list(range(cap.size))
    rank_q, rank_qn, rank_k, rank_kn = default_pair(cap, content)
    common.follow_owner(key("pos_for"), (model_id, text), {key("pos"): cap.n - 1})
    common.follow_owner(key("window_for"), (model_id, text, cap.start),
                    {key("flow_token"): cap.size - 1, key("line_q"): None,
                     key("rank_q"): rank_q, key("rank_k"): rank_k,
                     key("rank_qn"): rank_qn, key("rank_kn"): rank_kn})
    common.keep_in_options({key("pos"): (range(cap.n), cap.n - 1),
                        key("flow_token"): (range(cap.size), cap.size - 1),
                        key("line_q"): ([None, *range(cap.size)], None),
                        key("rank_q"): (range(cap.size), rank_q),
                        key("rank_k"): (range(cap.size), rank_k),
                        key("rank_qn"): (range(1, attention_views.MAX_SPAN + 1), rank_qn),
                        key("rank_kn"): (range(1, attention_views.MAX_SPAN + 1), rank_kn)})
    return content


def word(token: str) -> str:
    """A token as a plain lower-case word: no leading space, no ## continuation."""
    return token.lstrip("".join(tokens.LEADING_SPACE_MARKS)).removeprefix("##").lower()


def default_pair(cap: TextCapture, content: list[int]) -> tuple[int, int, int, int]:
    """Find heads' pair as window positions (query's last token, its token count, key's last
    token, its token count): the last pronoun of DEFAULT_PAIRS and the last occurrence before it
    of its noun, each as the tokens that spell it (a whole-token word first, else spelled across
    tokens: 苹果 over SmolLM2's byte pieces, 它 inside Gemma's 把它), for the first pair the text has
    (the default text has "it" and "animal"); else the last and the first content token."""
    window = [cap.tokens[cap.start + i] for i in range(cap.size)]
    words = [word(t) for t in window]

    def spans(text: str) -> list[tuple[int, int]]:
        found = [s for s in tokens.spelled_spans(window, text) if s[0] in content and s[1] in content]
        # tokens spelling the word and nothing else first ("animal", not the one in "animals")
        whole = [s for s in found if "".join(word(tokens.completed(window[i])) for i in range(s[0], s[1] + 1)) == text]
        return whole or found

    for pronoun, noun in DEFAULT_PAIRS:
        queries = spans(pronoun)
        if not queries:
            continue
        q_first, q_last = queries[-1]
        # a query looks from the tokens that complete its characters: byte pieces before them
        # hold only the start of a character (SmolLM2's "它…") and are left out
        while q_first < q_last and not tokens.completed(window[q_first]):
            q_first += 1
        keys = [k for k in spans(noun) if k[1] < q_first]
        if keys:
            return q_last, q_last - q_first + 1, keys[-1][1], keys[-1][1] - keys[-1][0] + 1
    return content[-1], 1, content[0], 1


def pick_head(picked_key: str, picked: tuple[int, int] | None):
    """Only a new pick (a click, a selected row) moves the head selectors: the pick stays in its
    widget's state across reruns."""
    ss = st.session_state
    if picked is not None and picked != ss.get(picked_key):
        ss[key("layer")], ss[key("head")] = picked
    ss[picked_key] = picked


def picked_row(table_key: str, heads: list[tuple[int, int]] | None) -> tuple[int, int] | None:
    """The (layer, head) of the row selected in a table whose rows are ``heads``."""
    rows = common.selected_rows(table_key) if heads else []
    return heads[rows[0]] if rows and rows[0] < len(heads) else None


def head_picks(model_id: str, cap: TextCapture, n_heads: int):
    """A selected row of the ranking or of the head scores, or a click on the overview, opens
    that head. The rows' heads were stored when their view drew them, so picking needs no
    recomputation here."""
    ss = st.session_state
    text = ss[key("text")]
    pair = (model_id, text, cap.start, ss[key("rank_q")], ss[key("rank_k")], ss.get(key("rank_qn")),
            ss.get(key("rank_kn")))
    if ss.get(key("rank_for")) != pair:     # another text or pair: the old selection is stale
        ss[key("rank_for")] = pair
        common.clear_selection(key("rank_table"))
        ss[key("rank_picked")] = None
        ss[key("rank_heads")] = None
    pick_head(key("rank_picked"), picked_row(key("rank_table"), ss.get(key("rank_heads"))))
    scores = ss.get(key("hs")) if ss.get(key("hs_for")) == model_id else None
    hs_heads = [tuple(int(v) for v in r) for r in scores[["layer", "head"]].to_numpy()] \
        if scores is not None else None
    pick_head(key("hs_picked"), picked_row(key("hs_table"), hs_heads))
    pick_head(key("picked"), common.picked_cell(key("overview"), n_heads))


def overview(s: Shown):
    """Every layer x head as one image; a click or the selectors choose the head."""
    cfg = s.cfg
    st.plotly_chart(common.clickable_overview(attention_figures.overview_figure(
                        s.cap.overview, per_head=s.per_head, selected=(s.layer, s.head),
                        hover_text=attention_views.known_roles(s))),
                    key=key("overview"), on_select="rerun", selection_mode="points", width="content")
    st.caption(f"{cfg.n_layers} layers × {cfg.n_heads} heads. Click a head, or choose it above; "
               "hover shows its role once the statistics are computed.")


def head_selectors(cfg) -> tuple[int, int, bool]:
    ss = st.session_state
    for state_key, count in ((key("layer"), cfg.n_layers), (key("head"), cfg.n_heads)):
        if ss.get(state_key) not in range(count):
            ss[state_key] = 0
    st.subheader(f"Every head: {cfg.n_layers} layers × {cfg.n_heads} heads")
    col_l, col_h, col_scale = st.columns(3)
    layer = col_l.selectbox("Layer", **shared_view.linked(key("layer"), options=range(cfg.n_layers)))
    head = col_h.selectbox("Head", **shared_view.linked(key("head"), options=range(cfg.n_heads)))
    per_head = col_scale.toggle("Scale each head to its own maximum", True, **shared_view.linked(key("per_head"), kind=bool))
    return layer, head, per_head


def linked_text():
    """On a session's first run, the text of the page's link: its own, or a bundled sample's."""
    if not shared_view.first_visit(key("text")):
        return
    text = st.query_params.get(key("text"))
    if text is None and st.query_params.get(key("sample")) in texts.seed_sentences():
        text = st.query_params.get(key("sample"))
    if text is not None:
        st.session_state[key("text")] = st.session_state[key("text_input")] = text


def page():
    """The whole Attention page below its title."""
    ss = st.session_state
    linked_text()
    ss.setdefault(key("text"), DEFAULT_TEXT)     # the text the results below belong to
    ss.setdefault(key("good"), DEFAULT_TEXT)     # the last text that ran without an error
    ss.setdefault(key("good_start"), 0)          # ... and its window start
    ss.setdefault(key("text_input"), ss[key("text")])
    model = common.model_picker(tasks=("encoder", "lm"))
    if model is None:
        st.stop()
    model_id = f"{model.info.key}@{id(model)}"
    text_input(model.cfg)
    cap = captured(model, model_id)
    notes(model, model_id, cap)
    content = follow_text(model_id, cap)
    head_picks(model_id, cap, model.cfg.n_heads)
    layer, head, per_head = head_selectors(model.cfg)
    s = Shown(model=model, model_id=model_id, text=ss[key("text")], cap=cap, layer=layer,
              head=head, per_head=per_head, content=content)
    overview(s)
    st.subheader(f"Layer {layer}, head {head}")
    choice = common.view_choice(PAGE, list(attention_views.VIEWS))
    attention_views.VIEWS[choice](s)
    sample = ss.get(key("sample"))
    shared_view.keep_text(key("text"), ss[key("text")], sample if sample not in (None, OWN) else DEFAULT_TEXT)
    shared_view.saved(key("text_input"))
    shared_view.share_bar(PAGE)
