"""attnviz.outputs: bounded text capture (exact against a full trace), next-token top-k,
sentence embeddings and similarity, the NPZ export."""
import io

import numpy as np
import pytest
import torch

from attnviz.base import jobs, lru
from attnviz.analysis import capture
from attnviz.analysis.stats import downsample_attention
from attnviz.base.limits import LIMITS
from attnviz.core.config import Config
from attnviz.weights.catalogue import random_model

from tests.tiny import BERT, LLAMA


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 50, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("cfg", [LLAMA, BERT], ids=["llama", "bert"])
def test_short_input_is_captured_whole_and_equals_trace(cfg):
    model = random_model(cfg, seed=1)
    ids = _ids(40)
    cap = capture.capture_text(model, ids)
    tr = model.trace(ids)
    assert cap.full and cap.start == 0 and cap.size == 40
    torch.testing.assert_close(cap.attentions, tr.attentions, rtol=0, atol=0)
    torch.testing.assert_close(cap.hidden, tr.hidden, rtol=0, atol=0)
    torch.testing.assert_close(cap.overview, downsample_attention(tr.attentions, 64))


@pytest.mark.parametrize("cfg", [LLAMA, BERT], ids=["llama", "bert"])
@pytest.mark.parametrize("start", [0, 37, 500])
@pytest.mark.parametrize("chunk_floats", [None, 4 * 150 * 20], ids=["own-weights", "recomputed"])
def test_long_input_window_and_pooled_overview_are_exact(cfg, start, chunk_floats, monkeypatch):
    """Both scans: a layer's weights small enough to take from the block itself, and (a chunk
    budget below H x n x n) recomputed query-chunk by query-chunk."""
    if chunk_floats is not None:
        monkeypatch.setattr(capture, "CHUNK_FLOATS", chunk_floats)
    model = random_model(cfg, seed=2)
    n = 150
    ids = _ids(n, seed=3)
    # A budget of 3*4*32*32 floats allows a 32-token window: the long, layer-by-layer path.
    budget = cfg.n_layers * cfg.n_heads * 32 * 32
    cap = capture.capture_text(model, ids, start=start, budget=budget, max_cell=16)
    tr = model.trace(ids)
    assert not cap.full and cap.size == 32
    assert cap.start == min(start, n - 32)          # clipped so the window fits
    s = cap.start
    torch.testing.assert_close(cap.attentions, tr.attentions[:, :, s:s + 32, s:s + 32],
                               atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(cap.overview, downsample_attention(tr.attentions, 16),
                               atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(cap.hidden, tr.hidden, atol=2e-5, rtol=1e-5)
    assert cap.window_tokens == tr.tokens[s:s + 32]


def test_long_path_of_a_pruned_model_keeps_heads_in_place():
    model = random_model(LLAMA, seed=4)
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[0, 1] = keep[2, :2] = False
    small = model.prune(keep)
    ids = _ids(100, seed=5)
    cap = capture.capture_text(small, ids, budget=3 * 4 * 24 * 24, max_cell=10)
    tr = small.trace(ids)
    torch.testing.assert_close(cap.attentions, tr.attentions[:, :, :24, :24], atol=2e-6, rtol=1e-5)
    assert cap.overview[0, 1].abs().max() == 0 and cap.overview[2, :2].abs().max() == 0


def test_window_size_bound():
    assert capture.window_size(30, 9) == 352            # SmolLM2: 30*9*352^2 <= 2^25
    assert capture.window_size(6, 12) == LIMITS.attention_window_tokens
    assert 30 * 9 * capture.window_size(30, 9) ** 2 <= capture.full_budget()


def test_renormalise_rows():
    a = torch.tensor([[[[0.2, 0.2], [0.0, 0.0]]]])
    r = capture.renormalise_rows(a)
    torch.testing.assert_close(r[0, 0, 0], torch.tensor([0.5, 0.5]))
    assert r[0, 0, 1].abs().sum() == 0


def test_next_token_topk_matches_full_logits():
    model = random_model(LLAMA, seed=6)
    ids = _ids(20)
    tr = model.trace(ids)
    top_ids, probs = capture.next_token_topk(model, tr.hidden[7], k=10)
    expected = torch.softmax(tr.logits[7], -1).topk(10)
    assert top_ids == expected.indices.tolist()
    torch.testing.assert_close(probs, expected.values)
    assert bool((probs[:-1] >= probs[1:]).all())


def test_next_token_topk_refuses_encoders_and_bad_rows():
    with pytest.raises(ValueError, match="not a language model"):
        capture.next_token_topk(random_model(BERT), torch.zeros(32))
    with pytest.raises(ValueError, match="hidden_row must be"):
        capture.next_token_topk(random_model(LLAMA), torch.zeros(5))


def test_sentence_embedding_is_normalised_mean():
    hidden = torch.tensor([[3.0, 0.0], [1.0, 4.0]])           # mean (2, 2)
    torch.testing.assert_close(capture.sentence_embedding(hidden),
                               torch.tensor([2.0, 2.0]) / 8 ** 0.5)
    with pytest.raises(ValueError):
        capture.sentence_embedding(torch.zeros(0, 4))


def test_minilm_similarity_ranks_paraphrase_above_unrelated():
    from attnviz.ui import common
    model = common.shared_model("minilm")
    a = "A man is eating food."
    same = capture.sentence_similarity(model, a, a)
    para = capture.sentence_similarity(model, a, "A man is eating a meal.")
    other = capture.sentence_similarity(model, a, "The stock market crashed today.")
    assert same == pytest.approx(1.0, abs=1e-5)
    assert para > 0.8 > 0.3 > other


def test_attention_npz_round_trip_without_pickle():
    model = random_model(LLAMA, seed=7)
    cap = capture.capture_text(model, _ids(12))
    data = np.load(io.BytesIO(capture.attention_npz(cap)), allow_pickle=False)
    np.testing.assert_array_equal(data["attentions"], cap.attentions.numpy())
    np.testing.assert_array_equal(data["ids"], cap.ids.numpy())
    assert list(data["tokens"]) == cap.tokens and int(data["start"]) == 0


def test_vision_models_are_refused():
    cfg = Config(family="vit", task="vision", n_layers=1, n_heads=2, n_kv_heads=2, d_model=8, d_head=4, d_ff=16,
                 image_size=28, patch_size=14, pre_norm=True)
    with pytest.raises(ValueError, match="Images page"):
        capture.capture_text(random_model(cfg), "hello")


def test_partial_character_candidates_show_their_bytes():
    from attnviz.ui import common
    model = common.shared_model("smollm2")
    whole = model.tokenizer.convert_tokens_to_ids("è¿Ļ")   # bytes E8 BF 99: the whole of 这
    assert capture.candidate_labels(model, [whole]) == ["这"]
    partial = model.tokenizer.convert_tokens_to_ids("ä½")   # bytes E4 BD: a character's start
    assert capture.candidate_labels(model, [partial]) == ["⟨E4 BD⟩…"]


# --- Long captures: progress, deadline, heavy-job slot, token cap ------------------------------
LONG = dict(budget=3 * 4 * 24 * 24, max_cell=10)      # a 24-token window: the layer-by-layer scan


def test_long_capture_reports_progress_per_layer_while_holding_a_heavy_job_slot():
    model = random_model(LLAMA, seed=8)
    seen = []
    cap = capture.capture_text(model, _ids(100, seed=9), progress=lambda done, total: seen.append(
        (done, total, jobs.running_jobs())), **LONG)
    assert not cap.full
    assert [(d, t) for d, t, _ in seen] == [(1, 3), (2, 3), (3, 3)]
    assert all(running == ["long text capture"] for _, _, running in seen)
    assert jobs.running_jobs() == []                                 # the slot is given back


def test_long_capture_stops_at_its_deadline_with_a_clear_message():
    model = random_model(LLAMA, seed=8)
    seen = []
    with pytest.raises(jobs.JobTimeout, match=r"time limit of 0 s.*after 0 of 3 layers.*shorter"):
        capture.capture_text(model, _ids(100), max_seconds=0.0,
                             progress=lambda d, t: seen.append(d), **LONG)
    assert seen == [] and jobs.running_jobs() == []
    assert issubclass(jobs.JobTimeout, ValueError)


def test_long_capture_can_be_cancelled_between_layers():
    model = random_model(LLAMA, seed=8)
    cancel = jobs.Cancel()
    seen = []

    def progress(done, total):
        seen.append(done)
        cancel.set()                                                 # e.g. the user pressed Stop

    with pytest.raises(jobs.JobCancelled):
        capture.capture_text(model, _ids(100), progress=progress, cancel=cancel, **LONG)
    assert seen == [1] and jobs.running_jobs() == []


def test_long_capture_is_refused_at_once_when_the_server_is_busy():
    model = random_model(LLAMA, seed=8)
    held = [jobs.heavy_job(f"sweep {i}") for i in range(capture.LIMITS.max_heavy_jobs)]
    for job in held:
        job.__enter__()
    try:
        with pytest.raises(jobs.ServerBusy, match="at most"):
            capture.capture_text(model, _ids(100), **LONG)
        short = capture.capture_text(model, _ids(20), **LONG)         # the whole-text path is light
        assert short.full
    finally:
        for job in held:
            job.__exit__(None, None, None)


def test_long_text_is_cut_to_the_token_cap_and_says_so():
    model = random_model(LLAMA, seed=8)                               # 256 positions
    cap = capture.capture_text(model, _ids(200), max_tokens=64, **LONG)
    tr = model.trace(_ids(200)[:64])
    assert cap.n == 64 and cap.truncated == 136 and cap.token_limit == 64
    torch.testing.assert_close(cap.hidden, tr.hidden, atol=2e-5, rtol=1e-5)
    message = capture.truncation_message(cap, LLAMA.max_positions)
    assert "first 64 tokens" in message and "136 tokens were dropped" in message
    whole = capture.capture_text(model, _ids(200), max_tokens=None, **LONG)
    assert whole.n == 200 and whole.truncated == 0 and capture.truncation_message(whole, 256) is None
    assert LIMITS.max_capture_tokens <= 4096          # the page's default keeps the scan bounded


def test_lru_keeps_the_most_recent_entries():
    store = lru.LRU(2)
    store.put("a", 1)
    store.put("b", 2)
    assert store.get("a") == 1                                        # a is now the most recent
    store.put("c", 3)
    assert "b" not in store and store.get("a") == 1 and store.get("c") == 3 and len(store) == 2
    assert store.get("missing") is None
