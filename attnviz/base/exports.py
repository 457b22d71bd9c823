"""CSV exports that are safe to open in a spreadsheet.

A text cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage return is taken as a formula
by Excel, LibreOffice and Google Sheets (CSV injection). Such cells get a leading apostrophe, the
convention those programs show as plain text; numbers (including negative ones) are left alone.

A cell holding a carriage return or a line feed anywhere is quoted: rows end in CRLF (RFC 4180),
and the csv writer quotes every cell holding a character of the row end. With pandas' "\n" alone a
bare "\r" went out unquoted, and spreadsheets (and Python's csv module) broke the row there, so
the rest of the cell ("m\r=1+1") began a new row with a live formula.
"""
from __future__ import annotations

import pandas as pd

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def neutralise(value):
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def safe_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of df whose text cells (and column names) cannot run as spreadsheet formulas."""
    out = df.copy()
    for column in out.columns:
        if out[column].dtype == object or pd.api.types.is_string_dtype(out[column]):
            out[column] = out[column].map(neutralise)
    out.columns = [neutralise(str(c)) for c in out.columns]
    return out


def csv_text(df: pd.DataFrame, **kwargs) -> str:
    """df.to_csv(index=False) with formula-looking text cells neutralised and any cell holding CR
    or LF quoted; the one CSV writer of the app and the CLI (write the text with newline="")."""
    kwargs.setdefault("index", False)
    kwargs["lineterminator"] = "\r\n"
    return safe_frame(df).to_csv(**kwargs)


def file_stem(*parts: str, max_chars: int = 80) -> str:
    """A file name stem saying what an export shows (model, text, head): the parts joined by
    "_", each reduced to letters, digits, "-" and "." (any script), the text cut to six words."""
    cleaned = []
    for part in parts:
        words = "".join(ch if ch.isalnum() or ch in "-." else " " for ch in str(part)).split()
        if words:
            cleaned.append("-".join(words[:6]))
    return "_".join(cleaned)[:max_chars].strip("_-") or "attnviz"
