"""The corpus tool's results files live in the server's private folder: made 0700, owned by the
server's user, never used through a symlink or when someone else made it or can write to it, so
no one else's files are deleted by the size limit and no planted file is resumed from."""
import os
import tempfile
from pathlib import Path

import pytest

from attnviz.analysis import corpus_engine
from attnviz.base import private


@pytest.fixture
def temp_root(monkeypatch, tmp_path):
    """The shared temporary folder, as the server sees it (no ATTNVIZ_PRIVATE_DIR set)."""
    monkeypatch.delenv(private.PRIVATE_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def results_folder():
    from attnviz.ui import heads_corpus
    store = heads_corpus.results_store()
    return None if store is None else store.folder


def test_the_results_folder_is_private_per_user(temp_root, monkeypatch):
    from attnviz.ui import heads_corpus
    monkeypatch.setattr(heads_corpus.st, "error", lambda message: pytest.fail(message))
    folder = results_folder()
    assert folder.is_relative_to(temp_root / f"attnviz-{os.getuid()}")
    for level in (folder, folder.parent):
        info = os.lstat(level)
        assert not level.is_symlink() and info.st_uid == os.getuid() and info.st_mode & 0o777 == 0o700


def test_a_symlink_at_the_private_name_is_refused_and_nothing_behind_it_is_deleted(temp_root, monkeypatch):
    from attnviz.ui import heads_corpus
    errors = []
    monkeypatch.setattr(heads_corpus.st, "error", errors.append)
    victim = temp_root / "someone-elses"
    (victim / "corpus-runs").mkdir(parents=True)
    precious = victim / "corpus-runs" / "data.jsonl"
    precious.write_text("x" * 1000)
    (temp_root / f"attnviz-{os.getuid()}").symlink_to(victim)
    assert results_folder() is None and "symlink" in errors[0]
    with pytest.raises(ValueError, match="symlink or not a folder"):
        private.private_dir("corpus-runs")
    assert precious.read_text() == "x" * 1000


def test_a_folder_someone_else_made_or_opened_is_refused(temp_root):
    root = temp_root / f"attnviz-{os.getuid()}"
    root.mkdir(mode=0o700)
    os.chmod(root, 0o777)                         # open to everyone: files may have been planted
    with pytest.raises(ValueError, match="open to others"):
        private.private_dir("corpus-runs")
    os.chmod(root, 0o700)
    if os.getuid() == 0:                          # as root the test can give it to another user
        os.chown(root, 65534, 65534)
        with pytest.raises(ValueError, match="belongs to another user"):
            private.private_dir("corpus-runs")
        os.chown(root, 0, 0)
    assert private.private_dir("corpus-runs") == root / "corpus-runs"


def test_a_results_file_that_is_a_symlink_is_neither_read_nor_written(tmp_path):
    target = tmp_path / "elsewhere.jsonl"
    target.write_text('{"run": {"x": 1}}\n')
    link = tmp_path / "run.jsonl"
    link.symlink_to(target)
    with pytest.raises(ValueError, match="never a link"):
        corpus_engine.ResultsFile(link, {"x": 1})
    dangling = tmp_path / "new.jsonl"
    dangling.symlink_to(tmp_path / "made-through-the-link.jsonl")
    with pytest.raises(ValueError, match="never a link"):
        corpus_engine.ResultsFile(dangling, {"x": 1})
    assert not (tmp_path / "made-through-the-link.jsonl").exists()
