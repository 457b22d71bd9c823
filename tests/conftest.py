import atexit
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Under pytest-xdist (`make test` runs `pytest -n 2`) each worker is a process with its own torch
# thread pool: the cores are split between the workers, so two workers on two cores do not run four
# spinning threads. Set before torch is imported; servers and Dask workers the tests start inherit it.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    _threads = str(max(1, _cores // _WORKERS))
    os.environ.setdefault("OMP_NUM_THREADS", _threads)
    os.environ.setdefault("MKL_NUM_THREADS", _threads)

# The server's private folder (the corpus tool's results files, evicted oldest first when over their
# budget) is per user by default: one per test process instead, so two workers, or a test run beside
# a developer's own server, never see or evict each other's files. Servers the tests start inherit it.
if not os.environ.get("ATTNVIZ_PRIVATE_DIR"):
    _private = tempfile.mkdtemp(prefix="attnviz-tests-")   # made 0700, as the app requires
    os.environ["ATTNVIZ_PRIVATE_DIR"] = _private
    atexit.register(shutil.rmtree, _private, ignore_errors=True)

import torch  # noqa: E402,F401  (imported once here so the first AppTest does not time out on it)
import transformers  # noqa: E402,F401

torch.manual_seed(0)
if _WORKERS > 1:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


import contextlib  # noqa: E402

import pytest  # noqa: E402

from attnviz.base import limits  # noqa: E402


@pytest.fixture
def set_limits():
    """`set_limits(max_text_chars=10)`: those limits, for every module, until the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda **changes: stack.enter_context(limits.override(**changes))


@pytest.fixture(scope="session")
def bytelevel():
    """A byte-level BPE like GPT-2's, trained here on English words only, so every CJK character and
    emoji splits into bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the cat sat on the mat", "hello world"] * 20, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


@pytest.fixture
def deadline_after_checks(monkeypatch):
    """`deadline_after_checks(n)`: every job's Deadline reads as expired after n checks in all, so a
    run stops between items at a known place, however fast this machine is."""
    from attnviz.base import jobs
    checks = [0]

    class StopsAfter:
        def __init__(self, seconds, what="this job"):
            pass

        def expired(self):
            checks[0] += 1
            return checks[0] > limit[0]

    limit = [0]

    def install(n: int):
        limit[0] = n
        monkeypatch.setattr(jobs, "Deadline", StopsAfter)
    return install


# ---------------------------------------------------------------- pytest-xdist grouping
# `make test` runs `pytest -n 2 --dist loadgroup`: tests go to whichever worker is free, except that
# tests sharing an `xdist_group` run in one worker. A fixture of module (class, package) scope is set
# up once per worker that runs a test needing it: a Streamlit server, a Chromium, a loaded model.
# So the tests of a module that use such a fixture form one group, and the fixture is made once.
# A test that must not run beside another of its kind (one that takes every core: a Dask cluster, a
# server with many sessions) is marked `pytest.mark.xdist_group("whole_machine")` in its module.
WIDE_SCOPES = {"module", "class", "package"}


def _wide_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(fixturedefs and fixturedefs[-1].scope in WIDE_SCOPES for fixturedefs in defs)


@pytest.hookimpl(tryfirst=True)   # before xdist reads the marks to name the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None and _wide_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
