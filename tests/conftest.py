import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402,F401  (imported once here so the first AppTest does not time out on it)
import transformers  # noqa: E402,F401

torch.manual_seed(0)


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
