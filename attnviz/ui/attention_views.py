"""The Attention page's views of the chosen head, one function each (`VIEWS`); the page runs only
the chosen one. What several views share (the window's attention, head statistics, rollout) is
made on first use and kept in server-wide caches bounded in bytes (`ui.shared_cache`)."""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st
import torch

from attnviz.analysis import capture
from attnviz.analysis import head_ranking
from attnviz.analysis import head_scores
from attnviz.analysis import stats
from attnviz.base import exports, jobs, names
from attnviz.base.limits import LIMITS
from attnviz.core import tokens
from attnviz.core.model import Model
from attnviz.figures import attention_figures
from attnviz.figures import render
from attnviz.figures import lab_figures
from attnviz.ui import common
from attnviz.ui import shared_view
from attnviz.ui import job_controls

PAGE = "attention"
COMPARE_TEXT = "The creature stayed on the pavement because it was exhausted."
SCORE_COLUMNS = ("previous_token", "induction", "duplicate_token")
MAX_SPAN = 8     # tokens a Find heads query or key may span (a word in byte pieces: 4 for 苹果)
LINES_WINDOW = 48  # tokens per side the lines view shows at once: more labels overlap at any height


def key(name: str) -> str:
    """This page's session-state and widget keys: "attention.<name>"."""
    return names.session_key(PAGE, name)


@dataclass
class Shown:
    """What every view of one run reads: the model, the captured text and the chosen head."""
    model: Model
    model_id: str
    text: str
    cap: capture.TextCapture
    layer: int
    head: int
    per_head: bool
    content: list[int]   # the window's non-special positions

    @property
    def cfg(self):
        return self.model.cfg

    @property
    def tokens(self) -> list[str]:
        return self.cap.window_tokens

    @property
    def owner(self) -> tuple:
        """The cache key of everything derived from this capture's window."""
        return (self.model_id, self.text, self.cap.start)


def window_attention(s: Shown) -> torch.Tensor:
    """[L, H, w, w] attention of the window: the capture's own when the whole text fits, else its
    rows renormalised inside the window (exact for a decoder window starting at token 0)."""
    if s.cap.full:
        return s.cap.attentions
    store = common.shared_cache("attention.window", 2, LIMITS.result_cache_mb)
    return common.cached_result(store, s.owner, lambda: capture.renormalise_rows(s.cap.attentions))


def window_special(s: Shown) -> torch.Tensor:
    return s.cap.special[s.cap.start: s.cap.start + s.cap.size]


def stats_of(s: Shown):
    """Head statistics of every head of the window (seconds for a long text: made on first use)."""
    store = common.shared_cache("attention.stats", 16, 64)
    return common.cached_result(store, s.owner, lambda: stats.head_stats(
        window_attention(s), window_special(s), causal=s.cfg.causal))


def known_roles(s: Shown):
    """[L][H] roles for the overview's hover when the statistics exist already, else None: the
    overview never waits for them."""
    table = common.shared_cache("attention.stats", 16, 64).get(s.owner)
    if table is None:
        return None
    return table.sort_values(["layer", "head"])["role"].to_numpy().reshape(s.cfg.n_layers,
                                                                           s.cfg.n_heads)


def rollout_of(s: Shown) -> torch.Tensor:
    store = common.shared_cache("attention.rollout", 8, 64)
    return common.cached_result(store, s.owner, lambda: stats.rollout(window_attention(s)))


def token_name(tokens: list[str]):
    """format_func of a token selector: "3: it" (None reads as every token); a widget shows its
    text as typed, so special tokens read <s>, not plotly's escaped &lt;s&gt;."""
    return lambda i: "all tokens" if i is None else f"{i}: {render.visible_token(tokens[i])}"


def title(s: Shown) -> str:
    return f"Layer {s.layer}, head {s.head}"


# ---------------------------------------------------------------- the views
def detail(s: Shown):
    cfg = s.cfg
    matrix = s.cap.attentions[s.layer, s.head]
    st.plotly_chart(attention_figures.head_heatmap(matrix, s.tokens, title=title(s), causal=cfg.causal),
                    key=key("detail"))
    # this head's statistics only: the whole table takes seconds on a long text
    one = s.cap.attentions[s.layer: s.layer + 1, s.head: s.head + 1]
    if not s.cap.full:
        one = capture.renormalise_rows(one)
    row = stats.head_stats(one, window_special(s), causal=cfg.causal).iloc[0]
    st.caption(f"Role: **{row['role']}** · entropy {row['entropy']:.2f} nats · mean distance "
               f"{row['mean_distance']:.1f} tokens · mean of row maxima {row['max_weight']:.2f} · "
               f"brightest cell {float(matrix.max()):.2f}"
               + (" · collapsed" if row["collapsed"] else "")
               + (" · uniform" if row["uniform"] else ""))


def lines(s: Shown):
    # The lines follow the chosen head; other heads of its layer can be added (reset on a new head).
    common.follow_owner(key("line_for"), (s.layer, s.head), {key("line_extra"): []})
    extra = st.multiselect(f"Also draw heads of layer {s.layer}",
                           [h for h in range(s.cfg.n_heads) if h != s.head], key=key("line_extra"))
    query = st.selectbox("Only from query", [None] + list(range(len(s.tokens))), key=key("line_q"),
                         format_func=token_name(s.tokens), persist_state="page")
    line_heads = [s.head, *sorted(h for h in extra if h != s.head)]
    n, window = len(s.tokens), None
    if n > LINES_WINDOW:  # hundreds of labels overlap: a window of tokens, following the chosen query
        start_key = key("line_start")
        ss = st.session_state
        ss[start_key] = min(int(ss.get(start_key, n - LINES_WINDOW)), n - LINES_WINDOW)
        if query is not None and not ss[start_key] <= query < ss[start_key] + LINES_WINDOW:
            ss[start_key] = max(0, min(query - LINES_WINDOW // 2, n - LINES_WINDOW))
        start = st.slider(f"First token shown ({LINES_WINDOW} at a time)", 0, n - LINES_WINDOW, key=start_key)
        window = (start, start + LINES_WINDOW)
        st.caption(f"Tokens {start}–{start + LINES_WINDOW - 1} of {n}: lines within the window only. "
                   "Hover a token for its three strongest links.")
    st.plotly_chart(attention_figures.lines_figure(s.cap.attentions[s.layer], s.tokens, line_heads, query,
                                     title=attention_figures.lines_title(s.layer, line_heads), window=window), key=key("lines"))


def span_label(labels: list[str], last: int, count: int) -> str:
    """A span in words: the characters each of its tokens completes, without leading-space marks
    (花 · 瓶; SmolLM2's four byte pieces of 苹果 read 苹 · 果); a piece that completes nothing
    shows its label."""
    pieces = [tokens.completed(labels[i]).lstrip("".join(tokens.LEADING_SPACE_MARKS))
              for i in range(max(0, last - count + 1), last + 1)]
    return " · ".join(p for p in pieces if p) or render.visible_token(labels[last])


def find_heads(s: Shown):
    ss = st.session_state
    st.caption("Which heads link one word to another? Pick the query (the word that looks) and the "
               "key (the word looked at), each as its last token and how many tokens it spans: every "
               "head is ranked by how much more the query attends to the key than the other words do "
               "(contrast), so a head where every word looks at the key is a column head, not a link. "
               "Select a row to open its head above.")
    col_q, col_qn, col_k, col_kn = st.columns([3, 1, 3, 1])
    name = token_name(s.tokens)
    rank_q = col_q.selectbox("Query (its last token)", range(len(s.tokens)), key=key("rank_q"),
                             format_func=name, persist_state="page")
    rank_qn = col_qn.number_input("tokens", 1, MAX_SPAN, key=key("rank_qn"), help="How many tokens, "
                                  "ending at the one chosen, spell the query: 2 for 把 · 它 split in two.")
    rank_k = col_k.selectbox("Key (its last token)", range(len(s.tokens)), key=key("rank_k"),
                             format_func=name, persist_state="page")
    rank_kn = col_kn.number_input("tokens ", 1, MAX_SPAN, key=key("rank_kn"), help="How many tokens, "
                                  "ending at the one chosen, spell the key: 2 for 花 · 瓶.")
    q_span = range(max(0, rank_q - rank_qn + 1), rank_q + 1)
    k_span = range(max(0, rank_k - rank_kn + 1), rank_k + 1)
    query, key_word = span_label(s.tokens, rank_q, rank_qn), span_label(s.tokens, rank_k, rank_kn)
    if set(q_span) & set(k_span):
        st.info(f"The query ({query}) and the key ({key_word}) share a token: pick two different words.")
        return
    try:
        ranking = head_ranking.rank_heads(window_attention(s), q_span, k_span, causal=s.cfg.causal,
                                          content=s.content)
    except ValueError as err:
        st.info(common.plain(str(err)))
        return
    for sentence in head_ranking.ranking_sentences(ranking, query, key_word):
        st.markdown(common.plain(sentence))
    # what a selected row opens, for the next run (which then needs no ranking to pick)
    ss[key("rank_heads")] = [tuple(int(v) for v in r) for r in ranking[["layer", "head"]].to_numpy()]
    pair = f"{attention_figures.token_label(query)} → {attention_figures.token_label(key_word)}"
    bar = lambda name: st.column_config.ProgressColumn(name, format="%.3f", min_value=0.0, max_value=1.0)  # noqa: E731
    st.dataframe(ranking, hide_index=True, key=key("rank_table"), on_select="rerun",
                 selection_mode="single-row",
                 column_config={"weight": bar("weight"), "others": bar("others"),
                                "contrast": st.column_config.NumberColumn("contrast", format="%+.3f"),
                                "pattern": st.column_config.TextColumn(
                                    "pattern", help="; ".join(f"{k}: {v}" for k, v in head_ranking.PATTERNS.items()))})
    st.plotly_chart(attention_figures.head_rank_figure(ranking, top=20, title=f"Top heads: {pair}"),
                    key=key("rank_bars"))
    st.download_button("Ranking CSV", exports.csv_text(ranking), "head_ranking.csv",
                       "text/csv", key=key("rank_csv"), on_click="ignore")


def statistics(s: Shown):
    table = stats_of(s)
    st.plotly_chart(attention_figures.role_map_figure(table), key=key("roles"))
    st.dataframe(table, hide_index=True, key=key("table"),
                 column_config={c: st.column_config.NumberColumn(format="%.3f")
                                for c in table.columns if table[c].dtype.kind == "f"})
    st.download_button("Statistics CSV", exports.csv_text(table), "head_stats.csv", "text/csv",
                       key=key("csv"), on_click="ignore")


@st.cache_data(max_entries=8, show_spinner=False)
def head_score_table(model_id: str, seq_len: int, n_seqs: int, seed: int, _model):
    """Previous-token / induction / duplicate-token scores of every head (model-wide, not of the
    text): one server-wide heavy-job slot and the importance time limit while computing; it
    stops between sequences when this browser session goes away."""
    with job_controls.heavy_job("head scores") as cancel:
        return head_scores.head_scores(
            _model, seq_len, n_seqs, seed, cancel=cancel,
            deadline=jobs.Deadline(LIMITS.max_importance_seconds, "head scores"))


def scores_view(s: Shown):
    ss, cfg = st.session_state, s.cfg
    st.caption("Previous-token, induction and duplicate-token scores of every head, measured as "
               "TransformerLens does: on repeated random-token sequences R + R (not on your text). "
               "Induction: attention from the copy to the token after the earlier copy; duplicate: "
               "to the earlier copy itself; previous-token: to the position before. Sort by a "
               "column; select a row to open its head above.")
    if cfg.task != "lm" or not cfg.causal:
        st.info("These scores are defined for causal language models: pick smollm2 in the sidebar.")
        return
    with st.form(key("hs_form")):
        c_t, c_n, c_s = st.columns(3)
        longest = head_scores.max_seq_len(s.model)
        seq_len = c_t.number_input("Length T of the random block", 4, longest, min(50, longest),
                                   key=key("hs_T"), help=f"4 to {longest} tokens; the sequence is R + R.")
        n_seqs = c_n.number_input("Sequences averaged", 1, 32, 4, key=key("hs_n"))
        seed = c_s.number_input("Seed", 0, 2**31 - 1, 0, key=key("hs_seed"))
        go = st.form_submit_button("Compute head scores")
    if go:
        try:
            with st.spinner(f"Scoring {cfg.n_layers * cfg.n_heads} heads on {int(n_seqs)} "
                            f"sequences of {2 * int(seq_len)} tokens…"):
                ss[key("hs")] = head_score_table(s.model_id, int(seq_len), int(n_seqs), int(seed),
                                                 s.model)
            ss[key("hs_for")] = s.model_id
            common.clear_selection(key("hs_table"))
        except ValueError as err:
            st.error(common.plain(err))
    scores = ss.get(key("hs")) if ss.get(key("hs_for")) == s.model_id else None
    if scores is None:
        st.info("Press Compute head scores (about 2 s for SmolLM2 at the defaults).")
        return
    st.dataframe(scores, hide_index=True, key=key("hs_table"), on_select="rerun",
                 selection_mode="single-row",
                 column_config={c: st.column_config.ProgressColumn(
                     c, format="%.3f", min_value=0.0, max_value=1.0) for c in SCORE_COLUMNS})
    shown = st.radio("Map of", horizontal=True,
                     **shared_view.linked(key("hs_map"), format_func=lambda c: c.replace("_", "-") + " score", options=SCORE_COLUMNS))
    grid = scores.pivot(index="layer", columns="head", values=shown).to_numpy()   # (L, H)
    st.plotly_chart(lab_figures.head_grid_figure(grid, f"{shown.replace('_', '-')} score: layer × head"),
                    key=key("hs_grid"))
    st.download_button("Head scores CSV", exports.csv_text(scores), "head_scores.csv",
                       "text/csv", key=key("hs_csv"), on_click="ignore")


def rollout(s: Shown):
    st.plotly_chart(attention_figures.head_heatmap(rollout_of(s), s.tokens,
                                     title="Attention rollout through all layers",
                                     causal=s.cfg.causal), key=key("rollout"))
    flow_token = st.selectbox("Follow token", range(len(s.tokens)), key=key("flow_token"),
                              format_func=token_name(s.tokens), persist_state="page")
    st.plotly_chart(attention_figures.token_flow_figure(stats.token_flow(window_attention(s), flow_token),
                                          s.tokens,
                                          title="Where it looks in each layer (heads averaged)"),
                    key=key("flow"))


@st.cache_resource(max_entries=16, show_spinner=False)
def embedding(model_id: str, text: str, _model) -> torch.Tensor:
    return capture.sentence_embedding(_model.trace(text, attentions=False).hidden)


def model_output(s: Shown):
    cap = s.cap
    if s.model.next_token:
        position = st.selectbox("After position", range(cap.n), key=key("pos"),
                                format_func=token_name(cap.tokens), persist_state="page")
        ids, probs = capture.next_token_topk(s.model, cap.hidden[position], k=10)
        st.plotly_chart(attention_figures.bar_topk(capture.candidate_labels(s.model, ids), probs,
                                     title=f"Next token after {position}: {attention_figures.token_label(cap.tokens[position])}"
                                           ", top 10"), key=key("topk"))
        return
    other = st.text_input("Compare with", COMPARE_TEXT, key=key("compare"),
                          help="a second sentence, compared with the page's text")
    st.caption("Compares the page's text with this second sentence as the sentence encoder does: "
               "each is mean-pooled over its tokens' last hidden states into one normalised "
               "embedding, and their cosine says how alike in meaning the model finds them "
               "(1 = same direction, 0 = unrelated).")
    if not other.strip():
        st.info("Type a second sentence to compare.")
        return
    try:
        mine = capture.sentence_embedding(cap.hidden)
        score = float(mine @ embedding(s.model_id, other, s.model))
        st.metric("Cosine similarity (mean-pooled, normalised embeddings)", f"{score:.3f}")
    except ValueError as err:
        st.error(common.plain(err))


def export(s: Shown):
    """Downloads (the figures and the NPZ are made only when clicked); a click keeps the page as it is."""
    cap, cfg = s.cap, s.cfg
    common.figure_downloads("Chosen head", cap.attentions[s.layer, s.head], s.tokens, s.tokens,
                        title(s), key=key("head_fig"), causal=cfg.causal,
                        file_name=exports.file_stem(s.model.info.key, s.text, names.head_name(s.layer, s.head)))
    common.figure_downloads("Rollout", lambda: rollout_of(s), s.tokens, s.tokens, "Attention rollout",
                        key=key("rollout_fig"), causal=cfg.causal,
                        file_name=exports.file_stem(s.model.info.key, s.text, "rollout"))
    overview_title = (f"{s.model.info.key}: {cfg.n_layers} layers × {cfg.n_heads} heads, "
                      f"{cap.n:,} tokens" + (", each head scaled to its maximum" if s.per_head else ""))
    st.download_button("Overview PNG", lambda: render.overview_png(cap.overview, per_head=s.per_head,
                                                                 title=overview_title),
                       exports.file_stem(s.model.info.key, s.text, "overview") + ".png", "image/png",
                       key=key("ov_png"), on_click="ignore")
    st.download_button("Attentions NPZ", lambda: capture.attention_npz(cap), "attentions.npz",
                       "application/octet-stream", key=key("npz"), on_click="ignore")
    st.download_button("Statistics CSV", exports.csv_text(stats_of(s)), "head_stats.csv",
                       "text/csv", key=key("csv2"), on_click="ignore")
    st.caption("The NPZ holds the window's attentions [layers, heads, n, n], the pooled overview, "
               "tokens and ids; load it with numpy.load(..., allow_pickle=False).")


VIEWS = {"Detail": detail, "Lines": lines, "Find heads": find_heads, "Statistics": statistics,
         "Head scores": scores_view, "Rollout & flow": rollout, "Model output": model_output,
         "Export": export}
