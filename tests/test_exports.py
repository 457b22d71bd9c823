"""Every CSV the app or the CLI writes goes through one writer (exports.csv_text), which neutralises
formula cells and quotes any cell holding a carriage return or a line feed."""
import ast
import csv
import io
from pathlib import Path

import pandas as pd

from attnviz.base import exports
from attnviz.latency import results

ROOT = Path(__file__).resolve().parents[1]
WRITERS = {"csv_text", "to_csv"}   # exports.csv_text and results.to_csv (which is csv_text)


def records(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


def test_a_cell_holding_cr_or_lf_stays_in_its_row_and_reads_back_exactly():
    df = pd.DataFrame({"model": ["m\r=1+1", "a\nb", "c\r\n@x", "plain"], "value": [1.5, -2.0, 3.0, 4.0]})
    text = exports.csv_text(df)
    rows = records(text)
    assert rows[0] == ["model", "value"] and len(rows) == 1 + len(df)
    assert [r[0] for r in rows[1:]] == df["model"].tolist()     # exact, each in its own row
    assert '"m\r=1+1"' in text and '"a\nb"' in text
    assert pd.read_csv(io.StringIO(text))["model"].tolist() == df["model"].tolist()


def test_latency_import_then_download_keeps_a_carriage_return_inside_its_cell():
    """The reproduction: a device CSV whose quoted model cell is "m\\r=1+1", imported (read_results)
    and downloaded again (results.to_csv, the Latency page's Download CSV)."""
    cfg = results.parse_synthetic("synthetic:layers=2,d=32,heads=4,ff=64,vocab=50,positions=64")
    row = dict(schema=results.SCHEMA, backend="cpu", measured=True, model="m\r=1+1",
               shape=results.config_spec(cfg), variant="fused", seq_len=8, n_heads=4, threads=4,
               median_ms=5.0, p10_ms=4.5, p90_ms=5.5, peak_mem_mb=1.0, cpu="Raspberry Pi 4", torch="2.x")
    good = results.to_csv(pd.DataFrame([row]))
    header, line = good.split("\r\n")[:2]
    assert '"m\r=1+1"' in line
    uploaded = (header + "\n" + line + "\n").encode()
    imported = results.read_results(uploaded)
    assert imported["model"].tolist() == ["m\r=1+1"]
    out = results.to_csv(imported)
    rows = records(out)
    assert len(rows) == 2 and rows[1][rows[0].index("model")] == "m\r=1+1"
    assert results.read_results(out.encode())["model"].tolist() == ["m\r=1+1"]


def _calls(tree: ast.AST, name: str):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr == name) or (isinstance(f, ast.Name) and f.id == name):
                yield node


def _writes_csv_text(expr: ast.AST) -> bool:
    """The data argument is a call of the one writer, or a lambda returning one."""
    if isinstance(expr, ast.Lambda):
        expr = expr.body
    return any(True for w in WRITERS for _ in _calls(expr, w))


def test_every_csv_download_button_and_file_goes_through_the_one_writer():
    sources = {p: ast.parse(p.read_text()) for p in sorted((ROOT / "attnviz").rglob("*.py"))}
    buttons = 0
    for path, tree in sources.items():
        for call in _calls(tree, "download_button"):
            consts = [a.value for a in ast.walk(call) if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if any("csv" in c.lower() for c in consts):
                buttons += 1
                data = call.args[1] if len(call.args) > 1 else next(k.value for k in call.keywords if k.arg == "data")
                assert _writes_csv_text(data), f"{path.name}:{call.lineno}: a CSV download not written by csv_text"
        for call in _calls(tree, "to_csv"):   # pandas' own writer: only inside the one writer
            f = call.func
            by_results = isinstance(f, ast.Name) or (isinstance(f.value, ast.Name) and f.value.id == "results")
            assert path.name == "exports.py" or by_results, \
                f"{path.name}:{call.lineno}: DataFrame.to_csv outside exports.csv_text"
        for name in ("writer", "DictWriter"):
            assert path.name == "exports.py" or not any(
                isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name) and c.func.value.id == "csv"
                for c in _calls(tree, name)), f"{path.name}: a csv.{name} outside exports.csv_text"
    assert buttons >= 10   # the page's CSV buttons were all found (not a vacuous pass)
