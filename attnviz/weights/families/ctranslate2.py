"""CTranslate2's `model.bin`: a reader in numpy (no ctranslate2 at run time, nothing executed). Not
a family: the Whisper family (`whisper.py` beside it) reads its CTranslate2 folders through it.

The binary spec (versions 1-6): a 4-byte version; from version 2 the spec name (a 2-byte length
counting its NUL, then the bytes) and a 4-byte spec revision; a 4-byte variable count; per variable
its name (as the spec name), a 1-byte rank, rank x 4-byte dims, a 1-byte dtype (0 f32, 1 i8, 2 i16,
3 i32, 4 f16, 5 bf16), a 4-byte byte count and the data; from version 3 a 4-byte alias count and
(alias, target) name pairs. Little-endian throughout.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

MAX_FILE_BYTES = 4 * 2**30    # far above whisper-tiny (76 MB); stops a hostile size before reading
MAX_VARIABLES = 100_000       # tiny.en holds ~170 variables
MAX_RANK = 8
DTYPES = {0: np.dtype("<f4"), 1: np.dtype("i1"), 2: np.dtype("<i2"), 3: np.dtype("<i4"), 4: np.dtype("<f2")}
BF16 = 5


def _fail(name: str, what: str) -> ValueError:
    return ValueError(f"{name}: {what}; it is not a CTranslate2 model.bin")


class _Cursor:
    """Bounds-checked little-endian reads over the file's bytes."""

    def __init__(self, data: np.ndarray, name: str):
        self.data, self.pos, self.name = data, 0, name

    def take(self, n: int, what: str) -> np.ndarray:
        if n < 0 or self.pos + n > self.data.size:
            raise _fail(self.name, f"the file ends inside {what}")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def uint(self, size: int, what: str) -> int:
        return int(self.take(size, what).view({1: "u1", 2: "<u2", 4: "<u4"}[size])[0])

    def string(self, what: str) -> str:
        n = self.uint(2, what)
        return bytes(self.take(n, what)).rstrip(b"\0").decode("utf-8", "replace")


def read_model_bin(path: str | Path, name: str | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """(variables, header): every variable as a numpy array in its stored dtype (float16 and
    bfloat16 widened to float32, int8 kept: a quantised model's `..._scale` sits beside it);
    aliases resolved to their target's array. `header`: version, spec name, revision."""
    path = Path(path)
    name = name or path.name
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise _fail(name, f"the file is {size:,} bytes")
    data = np.fromfile(path, dtype=np.uint8)
    cur = _Cursor(data, name)
    version = cur.uint(4, "the version")
    if not 1 <= version <= 6:
        raise _fail(name, f"binary version {version} (this reader knows 1 to 6)")
    spec, revision = "", 1
    if version >= 2:
        spec, revision = cur.string("the spec name"), cur.uint(4, "the spec revision")
    count = cur.uint(4, "the variable count")
    if count > MAX_VARIABLES:
        raise _fail(name, f"the header claims {count:,} variables")
    out: dict[str, np.ndarray] = {}
    for _ in range(count):
        var = cur.string("a variable name")
        rank = cur.uint(1, f"{var!r}'s rank")
        if rank > MAX_RANK:
            raise _fail(name, f"{var!r} has rank {rank}")
        shape = tuple(int(d) for d in cur.take(4 * rank, f"{var!r}'s shape").view("<u4"))
        kind = cur.uint(1, f"{var!r}'s dtype") if version >= 4 else 0
        n_bytes = cur.uint(4, f"{var!r}'s size")
        raw = cur.take(n_bytes, f"{var!r}'s data")
        out[var] = _decode(raw, kind, shape, var, name)
    if version >= 3 and cur.pos < data.size:
        for _ in range(cur.uint(4, "the alias count")):
            alias, target = cur.string("an alias"), cur.string("an alias target")
            if target not in out:
                raise _fail(name, f"alias {alias!r} points to a missing variable {target!r}")
            out[alias] = out[target]
    return out, {"version": version, "spec": spec, "revision": revision}


def _decode(raw: np.ndarray, kind: int, shape: tuple[int, ...], var: str, name: str) -> np.ndarray:
    n = math.prod(shape)
    if kind == BF16:  # bfloat16: the high half of a float32
        if raw.size != 2 * n:
            raise _fail(name, f"{var!r} holds {raw.size} bytes for shape {shape} in bfloat16")
        wide = raw.view("<u2").astype(np.uint32) << 16
        return wide.view(np.float32).reshape(shape)
    dtype = DTYPES.get(kind)
    if dtype is None:
        raise _fail(name, f"{var!r} has dtype code {kind}")
    if raw.size != dtype.itemsize * n:
        raise _fail(name, f"{var!r} holds {raw.size} bytes for shape {shape} in {dtype}")
    value = raw.view(dtype).reshape(shape)
    return value.astype(np.float32) if kind == 4 else value.copy()
