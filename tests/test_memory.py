"""The one capture estimate (attnviz.base.memory.plan_capture) and the server's memory guard."""
import pytest

from attnviz.base import jobs, memory


def test_a_capture_is_priced_from_its_shape_and_refused_or_chunked_above_the_budget(set_limits):
    set_limits(max_capture_mb=512)
    # SmolLM2's prompt pass at 8,192 tokens: 30 layers x 9 heads x 8192^2 float32 = 72 GB
    assert memory.capture_bytes(30, 9, 8192) == 30 * 9 * 8192 * 8192 * 4
    small = memory.plan_capture("two prompts", layers=30, heads=9, n=256, copies=2)
    assert small.mode == "full" and small.bytes == 2 * 30 * 9 * 256 * 256 * 4
    with pytest.raises(ValueError) as err:
        memory.plan_capture("two prompts", layers=30, heads=9, n=8192, copies=2, shorten="each prompt")
    message = str(err.value)
    longest = memory.longest_fitting(512 * 2**20, 30, 9, copies=2)
    assert "135 GB" in message and "512 MB" in message
    assert f"Shorten each prompt to at most {longest:,} tokens" in message
    assert memory.capture_bytes(30, 9, longest, copies=2) <= 512 * 2**20 < memory.capture_bytes(30, 9, longest + 1,
                                                                                                copies=2)
    chunked = memory.plan_capture("a long text", layers=30, heads=9, n=8192, chunked=True, chunk_bytes=64 * 2**20)
    assert chunked.mode == "chunked" and chunked.bytes > chunked.budget
    one_row = memory.plan_capture("a generation", layers=30, heads=9, n=4096, rows=1, copies=64)
    assert one_row.mode == "full" and one_row.bytes == 64 * 30 * 9 * 4096 * 4   # rows, not n x n
    set_limits(max_capture_mb=0)
    with pytest.raises(ValueError, match="at most 1 tokens"):
        memory.plan_capture("a view", layers=1, heads=1, n=2)


def test_a_job_that_would_pass_the_memory_budget_is_refused_before_it_starts(set_limits):
    now_mb = memory.rss_bytes() / 2**20
    set_limits(max_memory_mb=int(now_mb + 64))
    memory.check_room("a small job", 1 * 2**20)                      # fits
    with pytest.raises(ValueError, match="short of memory.*needs about 1,024 MB more"):
        memory.check_room("a big job", 2**30)
    with pytest.raises(ValueError, match="short of memory"):
        memory.plan_capture("a capture", layers=30, heads=9, n=512)  # 283 MB of weights: past the budget
    ran = []
    with pytest.raises(ValueError, match="short of memory"):
        with jobs.heavy_job("a sweep", need_bytes=2**30):
            ran.append(1)
    assert not ran and jobs.running_jobs() == []                     # refused before it started
    set_limits(max_memory_mb=int(now_mb // 2))                       # already past: every heavy job refused
    with pytest.raises(ValueError, match="short of memory"):
        with jobs.heavy_job("importance"):
            ran.append(1)
    assert not ran
    set_limits(max_memory_mb=0)                                      # the default: 3/4 of the machine
    assert memory.memory_budget_bytes() > memory.rss_bytes()
    with jobs.heavy_job("importance"):
        ran.append(1)
    assert ran == [1]


def test_every_view_that_captures_attention_asks_the_one_estimate_first(set_limits, monkeypatch):
    """Generation's prompt, two prompts, the logit lens and attribution, the Attention page's texts,
    Translate and Speech: each is priced by `memory.plan_capture` before it runs, so the server's
    memory guard refuses every one of them, with its message, before a block runs."""
    from attnviz.analysis import capture, generation, prompt_pair, readouts
    from attnviz.ui import speech_page, translate_page
    from attnviz.weights import catalogue
    from attnviz.weights.catalogue import random_model
    from tests.tiny import LLAMA
    lm = random_model(LLAMA, seed=1)
    ids = [3, 17, 5, 42, 8]
    blocks = []
    for block in lm.net.blocks:
        block.register_forward_pre_hook(lambda module, args: blocks.append(1))
    asked = []
    real = memory.plan_capture
    monkeypatch.setattr(memory, "plan_capture", lambda what, **kw: asked.append(what) or real(what, **kw))
    set_limits(max_memory_mb=1)
    runs = {"a generation": lambda: generation.generate(lm, ids, 3),
            "two prompts": lambda: prompt_pair.compare_prompts(lm, ids, ids[:4]),
            "the readout": lambda: readouts.logit_lens(lm, ids),
            "the attention of this text": lambda: capture.capture_text(lm, ids),
            "this translation": lambda: translate_page._translated.__wrapped__(
                "en-pt", "Hello.", 1, b"", catalogue.load_model("en-pt"), None),
            "this transcription": lambda: speech_page._transcribed.__wrapped__(
                "whisper-tiny-en", "", b"", catalogue.load_model("whisper-tiny-en"), b"", None)}
    for what, run in runs.items():
        with pytest.raises(ValueError, match="short of memory"):
            run()
        assert asked[-1] == what
    assert not blocks                                    # refused before any block of the model ran
