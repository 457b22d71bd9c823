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
