"""The on-disk conversion cache: a bundled checkpoint converted once into safetensors (never a
pickle) under $ATTNVIZ_CACHE (default ~/.cache/attnviz), keyed on the source file's path, size
and modification time. A damaged entry is rebuilt, never trusted; a new entry appears atomically,
made by one process while the others that need it wait for it."""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)
# The stages of a load, logged at INFO with `extra={"stage": ...}` so that a caller (the app's
# loading message) can show progress without this layer knowing about it.
STAGES = ("reading", "converting", "caching")


def cache_root() -> Path:
    root = os.environ.get("ATTNVIZ_CACHE") or Path.home() / ".cache" / "attnviz"
    return Path(root)


# Raised whenever what a converter stores changes (a config field, a state key), so an entry made
# by an older converter is rebuilt, never read as this one's. v2: `Config` carries `task` and
# `embedding_norm`, which the family files set. v3: the decoder families' structural fields
# (sandwich and parallel blocks, QK-norm, windows, soft caps, rope scaling, experts). v5: one pair of
# relative-bucket fields (`rel_buckets`, `rel_max_distance`) where there were two.
CACHE_VERSION = 5


def source_key(path: Path) -> str:
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|v{CACHE_VERSION}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


class ReadOnlyCache(ValueError):
    """The cache lacks a conversion and this process cannot write it (a cache mounted read-only)."""

    def __init__(self, root: Path, why: str):
        super().__init__(f"the model cache {root} lacks this model and cannot be written ({why})")
        self.root, self.why = root, why


def _read(folder: Path, key: str):
    """(config dict, state, folder) of a whole cache entry, or None (a damaged one is removed)."""
    from safetensors.torch import load_file
    done = folder / "config.json"
    if not done.exists():
        return None
    log.info("reading %s from the conversion cache", key, extra={"stage": "reading"})
    try:
        return json.loads(done.read_text()), load_file(str(folder / "weights.safetensors")), folder
    except Exception as err:  # a damaged cache entry is rebuilt, never trusted
        log.warning("conversion cache %s unreadable (%s); rebuilding", folder, err)
        shutil.rmtree(folder, ignore_errors=True)
        return None


def converted(key: str, source: Path, make):
    """Return (config dict, state, folder) from the cache, or run `make(folder)` once and store it.
    Processes that need the same entry at once (app replicas, test workers) wait on one lock file, so
    one of them converts and the others read what it stored."""
    from filelock import FileLock
    from safetensors.torch import save_file
    folder = cache_root() / f"{key}-{source_key(source)}"
    found = _read(folder, key)
    if found is not None:
        return found
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(folder.parent / f".{folder.name}.lock")
        lock.acquire()
    except OSError as err:
        if err.errno not in READ_ONLY:
            raise
        # a shared deployment mounts the cache read-only: the loader names the model and what fills it
        raise ReadOnlyCache(folder.parent, err.strerror) from None
    try:
        found = _read(folder, key)  # converted by another process while this one waited
        if found is not None:
            return found
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=folder.parent))
        log.info("converting %s to this app's format", key, extra={"stage": "converting"})
        meta, state = make(tmp)
        log.info("caching the converted %s on disk", key, extra={"stage": "caching"})
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "weights.safetensors"))
        (tmp / "config.json").write_text(json.dumps(meta))
        try:
            tmp.rename(folder)  # atomic: a reader either sees all of it or none
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # a process without the lock file (older code) won
        return meta, state, folder
    finally:
        lock.release()
