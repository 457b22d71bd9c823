"""Results files of corpus runs (resume): JSON lines written as items finish, bounded together in
bytes by a `ResultsStore`, read back only as far as they fit the run (see `ResultsFile`).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from attnviz.base.private import open_private


def _encode(value):
    """JSON for a task's figures: numpy arrays keep their dtype, so a resumed run reads back the
    very numbers it wrote (float32 values are exact as doubles; doubles round-trip through repr)."""
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": repr(value)}
    return value


# The only dtypes a results file's arrays are read into: numeric ones, at most 8 bytes an element, so
# an array never takes more than a few times its line's bytes (a string or void dtype of 5,000 bytes
# an element would turn a 70 KB line into gigabytes).
ARRAY_DTYPES = frozenset({"float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"})
MAX_LINE_BYTES = 16_000_000   # a record longer than this is not one a run wrote: skipped


def _decode(value):
    if isinstance(value, dict):
        if "__ndarray__" in value:
            if value.get("dtype") not in ARRAY_DTYPES:
                raise ValueError(f"an array of dtype {str(value.get('dtype'))[:40]!r}")
            return np.asarray(value["__ndarray__"], dtype=value["dtype"])
        if "__float__" in value:
            return float(value["__float__"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


RESULTS_BUDGET_ENV = "ATTNVIZ_CORPUS_RESULTS_MB"
RESULTS_BUDGET_MB = 256


def results_budget() -> int:
    """Bytes the app's results files may take together (ATTNVIZ_CORPUS_RESULTS_MB, default 256)."""
    text = os.environ.get(RESULTS_BUDGET_ENV, str(RESULTS_BUDGET_MB)).strip()
    try:
        mb = float(text)
    except ValueError:
        mb = float("nan")
    if not (math.isfinite(mb) and mb > 0):
        raise ValueError(f"{RESULTS_BUDGET_ENV} must be a positive number of megabytes; got {text!r}")
    return int(mb * 1_000_000)


class ResultsStore:
    """A folder of results files bounded in bytes together: before a line is written, the oldest
    other files (by last use) are removed until it fits. Every file counts, a cancelled run's too
    (it is kept so that Run resumes it, and goes first once it is the oldest); a line that does not
    fit even alone is not written (its item runs again on resume)."""

    def __init__(self, folder: str | Path, max_bytes: int):
        if not max_bytes > 0:
            raise ValueError(f"a results store needs a positive byte budget, not {max_bytes}")
        self.folder, self.max_bytes = Path(folder), int(max_bytes)

    def files(self) -> list[Path]:
        """The results files, oldest first."""
        if not self.folder.is_dir():
            return []
        found = []
        for p in self.folder.glob("*.jsonl"):
            try:
                found.append((p.stat().st_mtime_ns, p.name, p))
            except FileNotFoundError:   # removed meanwhile by another session
                continue
        return [p for *_, p in sorted(found)]

    def used(self) -> int:
        return sum(_size(p) for p in self.files())

    def make_room(self, keep: Path, need: int) -> bool:
        """Remove the oldest files other than `keep` until `need` more bytes fit; whether they do."""
        files = self.files()
        used = sum(_size(p) for p in files)
        for p in files:
            if used + need <= self.max_bytes:
                break
            if p.resolve() == Path(keep).resolve():
                continue
            used -= _size(p)
            p.unlink(missing_ok=True)
        return used + need <= self.max_bytes


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class ResultsFile:
    """A JSON-lines file written as items finish: a header naming the run, then one record per
    finished (phase, item). Reopening it with the same header gives back the records, so a resumed
    run skips what is done; a header for another run is refused. A line cut short by a crash, or any
    record that is not one this run could have written (an item it does not have, a field missing,
    an array of a non-numeric dtype; `corpus_records` checks the rest against the model) is skipped
    and counted in `skipped`: that item simply runs again. With a `store`, every line is written within the
    store's byte budget (`unsaved` counts the records that did not fit)."""

    def __init__(self, path: str | Path, header: dict, store: ResultsStore | None = None):
        self.path = Path(path)
        self.header = _encode(header)
        self.store = store
        self.unsaved = 0
        self.skipped = 0        # records read but not used: they do not fit this run
        items = header.get("items")     # a run's header names its item count: no record lies past it
        self.items = items if type(items) is int and items >= 0 else None
        self.records: dict[tuple[str, int], object] = {}
        if self.path.exists() and self.path.stat().st_size:
            self._read()
            os.utime(self.path)   # resumed: now the most recently used, the last to be removed
        else:
            self._append({"run": self.header})

    def _read(self):
        # undecodable bytes become U+FFFD: such a line is no record, and a bad header is refused below
        with open_private(self.path, append=False) as f:
            lines = f.read().splitlines()
        try:
            first = json.loads(lines[0])
        except (ValueError, IndexError, RecursionError):
            raise ValueError(f"{self.path.name} is not a corpus-run results file; give a new file name "
                             "to start a run, or the file an earlier run wrote to resume it") from None
        if not isinstance(first, dict) or first.get("run") != json.loads(json.dumps(self.header)):
            raise ValueError(f"{self.path.name} holds the results of another run (model, corpus, run kind, "
                             "mask or seed differ); give a new file name, or the same options as that run")
        for line in lines[1:]:
            if not line.strip():
                continue
            try:
                if len(line) > MAX_LINE_BYTES:
                    raise ValueError("a line longer than any record")
                rec = json.loads(line)
                phase, index = rec["phase"], rec["index"]
                if not (isinstance(phase, str) and type(index) is int and 0 <= index
                        and (self.items is None or index < self.items)):
                    raise ValueError("a record of an item this run does not have")
                self.records[(phase, index)] = _decode(rec["result"])
            except (KeyError, TypeError, ValueError, RecursionError):   # JSONDecodeError is a ValueError
                self.skipped += 1   # a line cut short by a crash, or one no run wrote: the item runs again

    def _append(self, obj) -> bool:
        line = json.dumps(obj) + "\n"
        if self.store is not None:
            fresh = not self.path.exists()
            # a file that lost its header to the budget takes no records (it could not be resumed)
            if (fresh and "run" not in obj) or not self.store.make_room(self.path, len(line.encode())):
                return False
        with open_private(self.path) as f:
            f.write(line)
        return True

    def add(self, phase: str, index: int, result):
        self.records[(phase, index)] = result
        if not self._append({"phase": phase, "index": index, "result": _encode(result)}):
            self.unsaved += 1
