"""A Hugging Face cache laid out by hand in a temporary folder (blobs/, refs/, snapshots/, the layout
huggingface_hub writes), holding tiny random models saved with safetensors and a tokenizer.json."""
from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

import pytest

import torch
import transformers as tf

from attnviz.weights import hub
from tests.test_parity import tiny

WORDS = ["[UNK]", "[EOS]", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "hello", "world", "."]
MAIN = "0123456789abcdef0123456789abcdef01234567"
OTHER = "89abcdef0123456789abcdef0123456789abcdef"


def tokenizer() -> tf.PreTrainedTokenizerFast:
    """A word-level tokenizer of a dozen words: its ids fit the tiny models' 99-entry vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]")


def model_folder(path: Path, family: str = "gpt2", seed_shift: float = 0.0):
    """A transformers folder (config.json, model.safetensors, tokenizer.json...) and its HF model."""
    hf = tiny(family)
    if seed_shift:
        with torch.no_grad():
            for p in hf.parameters():
                p.add_(seed_shift)
    hf.save_pretrained(path)   # safetensors: transformers' default
    tokenizer().save_pretrained(path)
    return hf


def lay_out(cache: Path, repo: str, folder: Path, commit: str = MAIN, refs=("main",)) -> Path:
    """Put `folder`'s files into `cache` as huggingface_hub stores them; returns the snapshot."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo_dir / "blobs").mkdir(exist_ok=True)
    for file in sorted(folder.iterdir()):
        data = file.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (repo_dir / "blobs" / digest).write_bytes(data)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / digest)
    for ref in refs:
        (repo_dir / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / ref).write_text(commit)
    return snapshot


def edit_config(folder: Path, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def offline_for_test(monkeypatch, root: Path, converted: Path | None = None) -> Path:
    """For one test: HF_HUB_CACHE at `root` (and ATTNVIZ_CACHE at `converted`), every Hub call an
    AssertionError (a test that allows one patches it again)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    if converted is not None:
        monkeypatch.setenv("ATTNVIZ_CACHE", str(converted))

    def no_network(*args, **kwargs):
        raise AssertionError("a Hub call was made")
    monkeypatch.setattr(hub, "HfApi", no_network)
    monkeypatch.setattr(hub, "snapshot_download", no_network)
    return root


@contextlib.contextmanager
def offline_cache(root: Path):
    """HF_HUB_CACHE pointed at `root` with every Hub call made impossible, for as long as a module's
    tests read models from it by name."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_CACHE", str(root))
    mp.setattr(hub, "HfApi", None)                  # no Hub call can happen
    mp.setattr(hub, "snapshot_download", None)
    try:
        yield root
    finally:
        mp.undo()
