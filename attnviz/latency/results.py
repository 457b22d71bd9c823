"""What a benchmark result is: the CSV schema that `python -m attnviz.bench` writes and the
Latency page imports (checked row by row and column by column), and model shapes as short text
(`synthetic:layers=6,d=384,heads=8[,...]`) so that every row carries what the cost model needs:
a CSV from a Raspberry Pi is checked and modelled without loading any model.

Every size in a shape is bounded (`SPEC_BOUNDS`), and so are a CSV's bytes, rows, sequence
lengths and thread counts: whatever a file says, reading and modelling it takes bounded time and
memory. Anything wrong in a CSV is a ValueError naming the row and the column."""
from __future__ import annotations

import csv
import functools
import io
import math
import os
import re

import pandas as pd

from attnviz.core.attention import parse_variant
from attnviz.core.config import Config
from attnviz.base.exports import FORMULA_START, csv_text
from attnviz.latency.engines import check_engine
from attnviz.weights.families import synthetic_preset

SCHEMA = "attnviz-bench/1"
COLUMNS = ["schema", "backend", "measured", "model", "shape", "variant", "seq_len", "n_heads", "threads",
           "median_ms", "p10_ms", "p90_ms", "peak_mem_mb", "tokens_per_s", "attention_ms", "projections_ms",
           "mlp_ms", "other_ms", "repeats", "warmup", "clock", "cpu", "cores", "arch", "torch", "python",
           "timestamp", "engine", "dtype", "test", "n_prompt", "depth", "pp_tps", "tg_tps"]
# Optional columns (the schema grew compatibly: a CSV without them still imports): engine and dtype
# (torch fp32 when absent), and llama-bench's decode fields: test ("" one forward pass, "pp" prompt
# processing of n_prompt tokens, "tg" one generated token at cache depth `depth`, "block" ONE block
# of the model on n tokens, its attention alone in attention_ms: `latency.crossover`), pp_tps, tg_tps.
DEFAULTS = {"engine": "torch", "dtype": "fp32", "test": ""}
REQUIRED = ["backend", "measured", "model", "shape", "variant", "seq_len", "n_heads", "threads",
            "median_ms", "p10_ms", "p90_ms", "peak_mem_mb", "cpu", "torch"]
MAX_CSV_BYTES, MAX_CSV_ROWS = 5_000_000, 100_000
MAX_SEQ_LEN = 1 << 17    # tokens of one forward pass, in a sweep or a CSV row
MAX_THREADS = 1024       # torch threads of one row
MAX_CELL_CHARS = 100     # of a bad cell quoted in an error message
# A forward pass's time in ms: 0.1 microseconds is below one kernel call on any CPU, 10^8 ms (28 h)
# beyond any sweep; outside these a number is a unit or typing error (1e308 once fitted a profile
# to inf, 1e-308 sent LAPACK errors to stderr). Memory: at most 10^9 MB (a petabyte).
MIN_MS, MAX_MS, MAX_MEM_MB = 1e-4, 1e8, 1e9

SPEC_KEYS = {"family", "layers", "d", "heads", "kv", "dh", "ff", "vocab", "positions", "causal"}
# (smallest, largest) of each number in a synthetic spec: beyond every released transformer
# (Llama 3 405B: 126 layers, d 16384, 128 heads, ff 53248, vocab 128256), small enough that a
# shape typed into a form or read from a CSV cannot make the cost model or a budget check crawl.
SPEC_BOUNDS = {"layers": (1, 256), "d": (1, 16384), "heads": (1, 256), "kv": (1, 256), "dh": (1, 1024),
               "ff": (1, 65536), "vocab": (0, 1_000_000), "positions": (1, 1 << 20), "causal": (0, 1)}
MAX_SPEC_CHARS = 300


def _short(text, limit: int = MAX_CELL_CHARS) -> str:
    text = str(text)
    return repr(text if len(text) <= limit else text[:limit] + "…")


def parse_synthetic(spec: str) -> Config:
    """'synthetic:layers=6,d=384,heads=8[,kv=..,dh=..,ff=..,vocab=..,positions=..,causal=1,family=..]'.

    Every number is bounded (SPEC_BOUNDS); a ValueError names the key and its bound."""
    if not isinstance(spec, str):
        raise ValueError(f"synthetic model {_short(spec)}: write it as text, e.g. synthetic:layers=6,d=384,heads=8")
    return _parse_synthetic(spec)


@functools.lru_cache(maxsize=512)  # a long CSV repeats a handful of shapes; Config is frozen
def _parse_synthetic(spec: str) -> Config:
    hint = "e.g. synthetic:layers=6,d=384,heads=8 (optional kv, dh, ff, vocab, positions, causal, family)"
    if len(spec) > MAX_SPEC_CHARS:
        raise ValueError(f"synthetic model {_short(spec, 40)}: longer than {MAX_SPEC_CHARS} characters; {hint}")
    name = _short(spec)
    body = spec.strip()[len("synthetic:"):] if spec.strip().startswith("synthetic:") else spec.strip()
    try:
        kv = dict(part.split("=", 1) for part in body.split(",") if part.strip())
        kv = {k.strip().lower(): v.strip() for k, v in kv.items()}
    except ValueError:
        raise ValueError(f"synthetic model {name}: write key=value pairs, {hint}") from None
    unknown = set(kv) - SPEC_KEYS
    if unknown or not {"layers", "d", "heads"} <= set(kv):
        raise ValueError(f"synthetic model {name}: " + (f"unknown keys {sorted(unknown)}; " if unknown else
                         "layers, d and heads are required; ") + hint)
    num = {}
    for k, v in kv.items():
        if k == "family":
            continue
        if not re.fullmatch(r"[+-]?[0-9]+", v):
            raise ValueError(f"synthetic model {name}: values must be whole numbers ({k}={_short(v, 20)}); {hint}")
        lo, hi = SPEC_BOUNDS[k]
        if not lo <= int(v) <= hi:
            if lo >= 1 and int(v) < 1:
                raise ValueError(f"synthetic model {name}: sizes must be positive ({k} must be between {lo} "
                                 f"and {hi:,}; got {_short(v, 20)})")
            raise ValueError(f"synthetic model {name}: {k} must be between {lo} and {hi:,}; got {_short(v, 20)}")
        num[k] = int(v)
    causal = bool(num.get("causal", 0))
    family = kv.get("family", "llama" if causal else "bert")
    try:
        preset = synthetic_preset(family)  # the family file's structure: norms, positions, task
    except ValueError as err:
        raise ValueError(f"synthetic model {name}: {err}") from None
    d, heads = num["d"], num["heads"]
    dh = num.get("dh") or (d // heads if d % heads == 0 else 0)
    if not dh:
        raise ValueError(f"synthetic model {name}: d ({d}) must be a multiple of heads ({heads}), or give dh")
    kv_heads = num.get("kv", heads)
    if kv_heads > heads or heads % kv_heads:
        raise ValueError(f"synthetic model {name}: n_heads ({heads}) must be a multiple of n_kv_heads "
                         f"({kv_heads}); kv must divide heads")
    vision = preset["task"] == "vision"
    if not vision and num.get("vocab", 1) < 1:
        raise ValueError(f"synthetic model {name}: vocab must be between 1 and "
                         f"{SPEC_BOUNDS['vocab'][1]:,} for a text model")
    if "causal" in kv:
        preset["causal"] = causal
    return Config(family=family, n_layers=num["layers"], n_heads=heads, n_kv_heads=kv_heads,
                  d_model=d, d_head=dh, d_ff=num.get("ff", 4 * d),
                  vocab_size=0 if vision else num.get("vocab", 1000),
                  max_positions=num.get("positions", 8192), **preset)


def config_spec(cfg: Config) -> str:
    """The synthetic spec with this Config's cost (what the CSV's `shape` column holds)."""
    return (f"synthetic:family={cfg.family},layers={cfg.n_layers},d={cfg.d_model},heads={cfg.n_heads},"
            f"kv={cfg.n_kv_heads},dh={cfg.d_head},ff={cfg.d_ff},vocab={cfg.vocab_size},"
            f"positions={cfg.max_positions},causal={int(cfg.causal)}")


def row_config(row) -> Config:
    """The Config a result row (CSV schema of attnviz.bench) ran: its `shape` with its kept heads."""
    cfg = parse_synthetic(row["shape"])
    return cfg if int(row["n_heads"]) == cfg.n_heads else with_heads(cfg, int(row["n_heads"]))


def with_heads(cfg: Config, k: int) -> Config:
    """The shape after keeping the first k query heads of every layer (and the K/V heads they read)."""
    return cfg.replace(head_dims=(k,) * cfg.n_layers, kv_dims=(math.ceil(k / cfg.group),) * cfg.n_layers)


# ---------------------------------------------------------------- CSV
def to_csv(df: pd.DataFrame) -> str:
    """The CSV schema, with text cells that a spreadsheet would run as formulas neutralised
    (`exports.csv_text`); `read_results` undoes that, so exports read back unchanged."""
    return csv_text(df.reindex(columns=COLUMNS))


def _unneutralise(column: pd.Series) -> pd.Series:
    """"'=x" (a cell `exports.csv_text` neutralised) back to "=x"; other cells as they are."""
    marked = column.str.startswith("'") & column.str[1:2].isin(FORMULA_START)
    return column.where(~marked, column.str[1:])


def _rows(text: str) -> tuple[list[str], list[list[str]]]:
    """Header and data rows; a row with more or fewer fields than the header is a row/column error."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        while header is not None and not any(c.strip() for c in header):
            header = next(reader, None)
        if header is None:
            raise ValueError("the CSV is empty; export one with `python -m attnviz.bench --out results.csv`")
        header = [c.strip() for c in header]
        rows = []
        for fields in reader:
            if not fields or not any(c.strip() for c in fields):
                continue  # blank lines, as pandas skips them
            r = len(rows) + 2  # row 1 is the header
            if len(rows) >= MAX_CSV_ROWS:
                raise ValueError(f"the CSV must hold between 1 and {MAX_CSV_ROWS:,} rows; it holds more")
            if len(fields) > len(header):
                raise ValueError(f"row {r}, column {len(header) + 1} (past the header's last column "
                                 f"{header[-1]!r}): {len(fields)} fields but the header names {len(header)} "
                                 f"columns (got {_short(fields[len(header)])}); a value with a comma must be "
                                 "quoted")
            if len(fields) < len(header):
                raise ValueError(f"row {r}, column {header[len(fields)]!r}: missing ({len(fields)} fields "
                                 f"but the header names {len(header)} columns)")
            rows.append(fields)
    except csv.Error as err:
        raise ValueError(f"row {reader.line_num}: this is not a readable CSV ({str(err)[:120]}); "
                         "export one with `python -m attnviz.bench --out results.csv`") from None
    return header, rows


def read_results(data) -> pd.DataFrame:
    """A CSV written by `python -m attnviz.bench --out` (bytes, text or a path), checked row by row and
    column by column: any problem is a ValueError that names the row and the column."""
    if isinstance(data, os.PathLike) or (isinstance(data, str) and "\n" not in data and os.path.isfile(data)):
        with open(data, "rb") as f:
            data = f.read(MAX_CSV_BYTES + 1)
    raw = data if isinstance(data, bytes) else str(data).encode("utf-8", "surrogatepass")
    if len(raw) > MAX_CSV_BYTES:
        raise ValueError(f"the CSV is larger than {MAX_CSV_BYTES // 1_000_000} MB; split the sweep "
                         f"(at most {MAX_CSV_ROWS:,} rows and {MAX_CSV_BYTES // 1_000_000} MB)")
    if not raw.strip():
        raise ValueError("the CSV is empty; export one with `python -m attnviz.bench --out results.csv`")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"this is not a readable CSV (not UTF-8 text at byte {err.start}); "
                         "export one with `python -m attnviz.bench --out results.csv`") from None
    if "\x00" in text:
        raise ValueError("this is not a readable CSV (it holds NUL bytes: a binary file?); "
                         "export one with `python -m attnviz.bench --out results.csv`")
    header, rows = _rows(text)
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise ValueError(f"this CSV was not written by `python -m attnviz.bench`: missing columns "
                         f"{', '.join(missing)}. Run the CLI on the device with --out FILE.csv and upload that file")
    seen = set()
    for c in header:
        if c in seen and c:
            raise ValueError(f"row 1, column {c!r}: the header names this column twice")
        seen.add(c)
    if not rows:
        raise ValueError(f"the CSV must hold between 1 and {MAX_CSV_ROWS:,} rows; it holds 0")
    df = pd.DataFrame(rows, columns=header, dtype=object)
    df = df.loc[:, [c for c in header if c]]  # unnamed columns (a trailing comma) carry nothing
    for col in df.columns:
        df[col] = _unneutralise(df[col].astype(str))
    try:
        return _check(df)
    except ValueError:
        raise
    except Exception as err:  # a safety net: a check that did not expect some value is still the CSV's fault
        raise ValueError(f"this CSV could not be checked ({type(err).__name__}: {str(err)[:120]}); "
                         "export one with `python -m attnviz.bench --out results.csv`") from None


def _check(df: pd.DataFrame) -> pd.DataFrame:
    if "schema" in df.columns and (bad := set(df["schema"].str.strip()) - {SCHEMA, ""}):
        value = sorted(bad)[0]
        i = int(df.index[df["schema"].str.strip() == value][0])
        raise ValueError(f"row {i + 2}, column 'schema': unsupported schema {_short(value)}; this version reads "
                         f"{SCHEMA}")

    def fail(col, i, why):
        raise ValueError(f"row {int(i) + 2}, column {col!r}: {why} (got {_short(df.at[i, col])})")

    flags = df["measured"].str.strip().str.lower()
    for i in df.index[~flags.isin(["true", "false", "1", "0", "yes", "no"])]:
        fail("measured", i, "must be true or false")
    for col, lo, hi in (("seq_len", 1, MAX_SEQ_LEN), ("n_heads", 1, SPEC_BOUNDS["heads"][1]),
                        ("threads", 1, MAX_THREADS), ("median_ms", MIN_MS, MAX_MS), ("p10_ms", 0, MAX_MS),
                        ("p90_ms", 0, MAX_MS), ("peak_mem_mb", 0, MAX_MEM_MB)):
        values = pd.to_numeric(df[col].str.strip().replace("", "nan"), errors="coerce").astype(float)
        bad = (values < lo) | (values.abs() == float("inf"))
        if col != "peak_mem_mb":  # memory may be absent (--no-memory)
            bad |= values.isna()
        for i in df.index[bad]:
            fail(col, i, f"must be a finite number of at least {lo:g}" + (" ms (a forward pass takes longer "
                         "than 0.1 microseconds)" if col == "median_ms" else ""))
        for i in df.index[values > hi]:
            fail(col, i, f"must be at most {hi:,}" if hi < 1e6 else f"must be at most {hi:.0e}" +
                 (" ms" if col.endswith("_ms") else " MB"))
        df[col] = values
    for col in ("seq_len", "n_heads", "threads"):
        for i in df.index[df[col] != df[col].round()]:
            fail(col, i, "must be a whole number")
    for i in df.index[(df["p10_ms"] > df["median_ms"] * 1.0001) | (df["median_ms"] > df["p90_ms"] * 1.0001)]:
        fail("median_ms", i, "p10_ms <= median_ms <= p90_ms must hold")
    for col, check in (("variant", parse_variant), ("shape", parse_synthetic)):
        for value in df[col].unique():  # each distinct text once: a long sweep repeats a handful
            try:
                check(value)
            except ValueError as err:
                fail(col, df.index[df[col] == value][0], str(err))
    heads = df["shape"].map(lambda s: parse_synthetic(s).n_heads)
    for i in df.index[df["n_heads"] > heads]:
        fail("n_heads", i, f"must be at most the shape's {heads[i]} heads per layer")
    for i in df.index[df["backend"].str.strip() == ""]:
        fail("backend", i, "must name the backend (cpu, pi4, pi5, ...)")
    for col, default in DEFAULTS.items():
        df[col] = df[col].str.strip().replace("", default) if col in df.columns else default
    df["measured"] = flags.isin(["true", "1", "yes"])
    for (engine, dtype, measured), rows in df.groupby(["engine", "dtype", "measured"]):
        try:
            check_engine(engine, dtype, measured=bool(measured))
        except ValueError as err:
            fail("engine", rows.index[0], str(err))
    for i in df.index[~df["test"].isin(["", "pp", "tg", "block"])]:
        fail("test", i, "must be empty (one forward pass), pp, tg or block (one block of the model)")
    for col in ("seq_len", "n_heads", "threads"):
        df[col] = df[col].astype(int)
    for col in ("attention_ms", "projections_ms", "mlp_ms", "other_ms", "repeats", "warmup", "cores", "n_prompt",
                "depth", "pp_tps", "tg_tps"):
        if col in df.columns:  # informative only: unreadable values become empty
            df[col] = pd.to_numeric(df[col], errors="coerce")
    df["tokens_per_s"] = df["seq_len"] / (df["median_ms"] / 1e3)
    return df.reindex(columns=list(dict.fromkeys(COLUMNS + list(df.columns))))
