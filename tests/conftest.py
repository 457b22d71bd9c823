import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402,F401  (imported once here so the first AppTest does not time out on it)
import transformers  # noqa: E402,F401

torch.manual_seed(0)
