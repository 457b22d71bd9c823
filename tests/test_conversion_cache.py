"""The conversion cache shared by processes (app replicas, pytest-xdist workers): two that need the same
entry at once convert it once, the other reads what the first stored; a read-only cache is still a
message, and an entry appears whole or not at all."""
import threading

import filelock
import pytest
import torch

from attnviz.weights import conversion_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "model.bin"
    source.write_bytes(b"weights")
    return source


def test_two_loads_at_once_convert_once_and_the_second_reads_the_first(cache, monkeypatch):
    second_waits, calls, got = threading.Event(), [], {}

    class Announced(filelock.FileLock):
        def acquire(self, *args, **kwargs):
            if threading.current_thread().name == "second":
                second_waits.set()           # the second load has looked and is about to wait
            return super().acquire(*args, **kwargs)
    monkeypatch.setattr(filelock, "FileLock", Announced)

    def make(_tmp):
        calls.append(threading.current_thread().name)
        if len(calls) == 1:                  # the first converts until the second is at the lock
            second = threading.Thread(target=lambda: got.update(second=conversion_cache.converted("m", cache, make)),
                                      name="second")
            second.start()
            assert second_waits.wait(60)
            got["thread"] = second
        return {"d": 3}, {"w": torch.arange(3.0)}

    meta, state, folder = conversion_cache.converted("m", cache, make)
    got["thread"].join(60)
    assert calls == ["MainThread"]          # one conversion; the second load read it from disk
    meta2, state2, folder2 = got["second"]
    assert meta == meta2 == {"d": 3} and folder == folder2 and torch.equal(state2["w"], state["w"])
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".m-") and p.is_dir()] == []  # no half entry


def test_a_cache_that_cannot_be_written_is_a_read_only_message(cache, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(filelock.FileLock, "acquire", refuse)
    with pytest.raises(conversion_cache.ReadOnlyCache, match="lacks this model and cannot be written"):
        conversion_cache.converted("m", cache, lambda tmp: ({}, {}))
