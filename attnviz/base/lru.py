"""A small thread-safe least-recently-used map, bounded in entries and in bytes.

One `LRU` is shared by every browser session of a server (e.g. captures keyed on model and text),
so its bound is a bound on the server's memory, not per user: `LRU(max_entries, max_bytes)` drops
the least recently used entries until both hold, and refuses (does not store) a single value larger
than `max_bytes` rather than emptying itself for it.

Sizes are estimated by `nbytes(value)`: tensors (`numel * element_size`), numpy arrays, pandas
frames and series (`memory_usage(deep=True)`), bytes and str, and containers, dataclasses and plain
objects walked recursively, each object counted once. Duck typing keeps this layer free of torch.
"""
from __future__ import annotations

import dataclasses
import sys
import threading
from collections import OrderedDict

_MAX_DEPTH = 8      # deeper structures are counted shallowly: results here are a few levels deep


def nbytes(value, _seen: set | None = None, _depth: int = 0) -> int:
    """Estimated bytes held by `value` (what keeping it in a cache costs)."""
    seen = set() if _seen is None else _seen
    if id(value) in seen or value is None:
        return 0
    seen.add(id(value))
    if hasattr(value, "element_size") and hasattr(value, "numel"):          # torch.Tensor
        return int(value.numel()) * int(value.element_size())
    if hasattr(value, "memory_usage") and hasattr(value, "columns"):        # pandas.DataFrame
        return int(value.memory_usage(index=True, deep=True).sum())
    if hasattr(value, "memory_usage") and hasattr(value, "dtype"):          # pandas.Series / Index
        return int(value.memory_usage(deep=True))
    if hasattr(value, "nbytes") and hasattr(value, "dtype"):                # numpy.ndarray
        return int(value.nbytes)
    if isinstance(value, (bytes, bytearray, memoryview, str, int, float, complex, bool)):
        return sys.getsizeof(value)
    if _depth >= _MAX_DEPTH:
        return sys.getsizeof(value)
    deeper = _depth + 1
    if isinstance(value, dict):
        return sys.getsizeof(value) + sum(nbytes(k, seen, deeper) + nbytes(v, seen, deeper)
                                          for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return sys.getsizeof(value) + sum(nbytes(v, seen, deeper) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sys.getsizeof(value) + sum(nbytes(getattr(value, f.name, None), seen, deeper)
                                          for f in dataclasses.fields(value))
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return sys.getsizeof(value) + nbytes(vars(value), seen, deeper)
    return sys.getsizeof(value)


class LRU:
    """A thread-safe least-recently-used map (get / put) bounded by `max_entries` and, when given,
    by `max_bytes` of estimated size (`nbytes`, or the `sizeof` function passed in)."""

    def __init__(self, max_entries: int, max_bytes: int | None = None, sizeof=None):
        self.max_entries = max(1, int(max_entries))
        if max_bytes is not None and not max_bytes > 0:
            raise ValueError(f"max_bytes must be positive (or None for no byte bound), not {max_bytes}")
        self.max_bytes = None if max_bytes is None else int(max_bytes)
        self._sizeof = sizeof or nbytes
        self._items: OrderedDict = OrderedDict()   # key -> (value, size)
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key, default=None):
        with self._lock:
            if key not in self._items:
                return default
            self._items.move_to_end(key)
            return self._items[key][0]

    def put(self, key, value) -> bool:
        """Store `value` as the most recent entry; False (and nothing stored) when it alone exceeds
        `max_bytes`. Sizes are taken outside the lock: a large result takes a moment to walk."""
        size = int(self._sizeof(value)) if self.max_bytes is not None else 0
        with self._lock:
            self._discard(key)
            if self.max_bytes is not None and size > self.max_bytes:
                return False
            self._items[key] = (value, size)
            self._bytes += size
            while len(self._items) > self.max_entries or (
                    self.max_bytes is not None and self._bytes > self.max_bytes):
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped
            return True

    def resize(self, max_bytes: int | None):
        """A new byte bound (a deployment's limit read again); the oldest entries go until it holds.
        Only a cache that had a byte bound takes sizes, so it keeps one."""
        if self.max_bytes is None or not (max_bytes or 0) > 0:
            raise ValueError(f"resize needs a cache with a byte bound and a positive one, not {max_bytes}")
        with self._lock:
            self.max_bytes = int(max_bytes)
            while self._items and self._bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped

    def sizes(self) -> list[tuple]:
        """(key, estimated bytes) of every entry, least recently used first."""
        with self._lock:
            return [(key, size) for key, (_, size) in self._items.items()]

    def pop(self, key, default=None):
        with self._lock:
            item = self._items.get(key)
            self._discard(key)
            return default if item is None else item[0]

    def clear(self):
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def _discard(self, key):   # caller holds the lock
        item = self._items.pop(key, None)
        if item is not None:
            self._bytes -= item[1]

    @property
    def nbytes(self) -> int:
        """Estimated bytes of everything held (0 when there is no byte bound: sizes are not taken)."""
        with self._lock:
            return self._bytes

    def __contains__(self, key) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
