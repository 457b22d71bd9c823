"""What a benchmark result is: the CSV schema that `python -m attnviz.bench` writes and the
Latency page imports (checked column by column), and model shapes as short text
(`synthetic:layers=6,d=384,heads=8[,...]`) so that every row carries what the cost model needs:
a CSV from a Raspberry Pi is checked and modelled without loading any model."""
from __future__ import annotations

import io
import math
import os

import pandas as pd

from .attention import parse_variant
from .config import Config

SCHEMA = "attnviz-bench/1"
COLUMNS = ["schema", "backend", "measured", "model", "shape", "variant", "seq_len", "n_heads", "threads",
           "median_ms", "p10_ms", "p90_ms", "peak_mem_mb", "tokens_per_s", "attention_ms", "projections_ms",
           "mlp_ms", "other_ms", "repeats", "warmup", "clock", "cpu", "cores", "arch", "torch", "python",
           "timestamp"]
REQUIRED = ["backend", "measured", "model", "shape", "variant", "seq_len", "n_heads", "threads",
            "median_ms", "p10_ms", "p90_ms", "peak_mem_mb", "cpu", "torch"]
MAX_CSV_BYTES, MAX_CSV_ROWS = 5_000_000, 100_000

FAMILY_PRESETS = {
    "bert": dict(norm="layernorm", positional="learned", pre_norm=False, activation="gelu", type_vocab_size=2,
                 final_norm=False),
    "gpt2": dict(norm="layernorm", positional="learned", pre_norm=True, activation="gelu_tanh", causal=True,
                 tie_embeddings=True, norm_eps=1e-5),
    "llama": dict(norm="rmsnorm", positional="rotary", pre_norm=True, activation="silu", gated_mlp=True,
                  causal=True, qkv_bias=False, out_bias=False, mlp_bias=False, tie_embeddings=True, norm_eps=1e-5),
    "vit": dict(pre_norm=True, positional="learned", image_size=224, patch_size=16),
    "dinov2": dict(pre_norm=True, positional="learned", image_size=224, patch_size=14, layer_scale=True),
}
SPEC_KEYS = {"family", "layers", "d", "heads", "kv", "dh", "ff", "vocab", "positions", "causal"}


def parse_synthetic(spec: str) -> Config:
    """'synthetic:layers=6,d=384,heads=8[,kv=..,dh=..,ff=..,vocab=..,positions=..,causal=1,family=..]'."""
    body = spec.strip()[len("synthetic:"):] if spec.strip().startswith("synthetic:") else spec.strip()
    hint = "e.g. synthetic:layers=6,d=384,heads=8 (optional kv, dh, ff, vocab, positions, causal, family)"
    try:
        kv = dict(part.split("=", 1) for part in body.split(",") if part.strip())
        kv = {k.strip().lower(): v.strip() for k, v in kv.items()}
    except ValueError:
        raise ValueError(f"synthetic model {spec!r}: write key=value pairs, {hint}") from None
    unknown = set(kv) - SPEC_KEYS
    if unknown or not {"layers", "d", "heads"} <= set(kv):
        raise ValueError(f"synthetic model {spec!r}: " + (f"unknown keys {sorted(unknown)}; " if unknown else
                         "layers, d and heads are required; ") + hint)
    try:
        num = {k: int(v) for k, v in kv.items() if k != "family"}
    except ValueError:
        raise ValueError(f"synthetic model {spec!r}: values must be whole numbers; {hint}") from None
    if any(v < (0 if k in ("causal", "vocab") else 1) for k, v in num.items()):
        raise ValueError(f"synthetic model {spec!r}: sizes must be positive")
    causal = bool(num.get("causal", 0))
    family = kv.get("family", "llama" if causal else "bert")
    if family not in FAMILY_PRESETS:
        raise ValueError(f"synthetic model {spec!r}: family must be one of {', '.join(FAMILY_PRESETS)}")
    d, heads = num["d"], num["heads"]
    dh = num.get("dh") or (d // heads if d % heads == 0 else 0)
    if not dh:
        raise ValueError(f"synthetic model {spec!r}: d ({d}) must be a multiple of heads ({heads}), or give dh")
    preset = dict(FAMILY_PRESETS[family])
    if "causal" in kv:
        preset["causal"] = causal
    return Config(family=family, n_layers=num["layers"], n_heads=heads, n_kv_heads=num.get("kv", heads),
                  d_model=d, d_head=dh, d_ff=num.get("ff", 4 * d),
                  vocab_size=0 if family in ("vit", "dinov2") else num.get("vocab", 1000),
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
    return df.reindex(columns=COLUMNS).to_csv(index=False)


def read_results(data) -> pd.DataFrame:
    """A CSV written by `python -m attnviz.bench --out` (bytes, text or a path), checked column by column."""
    if isinstance(data, os.PathLike) or (isinstance(data, str) and "\n" not in data and os.path.isfile(data)):
        with open(data, "rb") as f:
            data = f.read(MAX_CSV_BYTES + 1)
    raw = data if isinstance(data, bytes) else str(data).encode()
    if len(raw) > MAX_CSV_BYTES:
        raise ValueError(f"the CSV is larger than {MAX_CSV_BYTES // 1_000_000} MB; split the sweep")
    if not raw.strip():
        raise ValueError("the CSV is empty; export one with `python -m attnviz.bench --out results.csv`")
    try:
        df = pd.read_csv(io.StringIO(raw.decode("utf-8-sig")), dtype=str, keep_default_na=False)
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise ValueError(f"this is not a readable CSV ({str(err).splitlines()[0][:120]}); "
                         "export one with `python -m attnviz.bench --out results.csv`") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"this CSV was not written by `python -m attnviz.bench`: missing columns "
                         f"{', '.join(missing)}. Run the CLI on the device with --out FILE.csv and upload that file")
    if len(df) == 0 or len(df) > MAX_CSV_ROWS:
        raise ValueError(f"the CSV must hold between 1 and {MAX_CSV_ROWS:,} rows; it holds {len(df):,}")
    if "schema" in df.columns and (bad := set(df["schema"]) - {SCHEMA, ""}):
        raise ValueError(f"unsupported schema {sorted(bad)[0]!r}; this version reads {SCHEMA}")

    def fail(col, i, why):
        raise ValueError(f"row {i + 2}, column {col!r}: {why} (got {df.at[i, col]!r})")

    flags = df["measured"].str.strip().str.lower()
    for i in df.index[~flags.isin(["true", "false", "1", "0", "yes", "no"])]:
        fail("measured", i, "must be true or false")
    df["measured"] = flags.isin(["true", "1", "yes"])
    for col, lo in (("seq_len", 1), ("n_heads", 1), ("threads", 1), ("median_ms", 0), ("p10_ms", 0),
                    ("p90_ms", 0), ("peak_mem_mb", 0)):
        values = pd.to_numeric(df[col].str.strip().replace("", "nan"), errors="coerce")
        bad = (values < lo) | (values.abs() == float("inf"))
        bad |= values.isna() if col != "peak_mem_mb" else False  # memory may be absent (--no-memory)
        for i in df.index[bad | ((values <= 0) if col == "median_ms" else False)]:
            fail(col, i, f"must be a number {'above' if col == 'median_ms' else 'at least'} {lo}")
        df[col] = values
    for col in ("seq_len", "n_heads", "threads"):
        for i in df.index[df[col] != df[col].round()]:
            fail(col, i, "must be a whole number")
        df[col] = df[col].astype(int)
    for i in df.index[(df["p10_ms"] > df["median_ms"] * 1.0001) | (df["median_ms"] > df["p90_ms"] * 1.0001)]:
        fail("median_ms", i, "p10_ms <= median_ms <= p90_ms must hold")
    for col, check in (("variant", parse_variant), ("shape", parse_synthetic)):
        for value in df[col].unique():  # each distinct text once: a long sweep repeats a handful
            try:
                check(value)
            except ValueError as err:
                fail(col, df.index[df[col] == value][0], str(err))
    for i in df.index[df["backend"].str.strip() == ""]:
        fail("backend", i, "must name the backend (cpu, pi4, pi5, ...)")
    for col in ("attention_ms", "projections_ms", "mlp_ms", "other_ms", "repeats", "warmup", "cores"):
        if col in df.columns:  # informative only: unreadable values become empty
            df[col] = pd.to_numeric(df[col], errors="coerce")
    df["tokens_per_s"] = df["seq_len"] / (df["median_ms"] / 1e3)
    return df.reindex(columns=list(dict.fromkeys(COLUMNS + list(df.columns))))
