"""The architecture's rules, read from the source text (see README, "Architecture").

Layers import only downward: base -> uploads -> core -> toys -> weights -> analysis | latency -> figures
-> ui.
Only attnviz/ui imports streamlit; plotly and matplotlib only figures and ui; no attnviz import
inside a function; no private name taken from another module; pages and app.py <= 80 lines;
library files <= 400 lines.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "attnviz"
RANK = {"base": 0, "uploads": 1, "core": 2, "toys": 3, "weights": 4, "analysis": 5, "latency": 5, "figures": 6,
        "ui": 7}
ENTRY = {"__init__", "bench", "evaluate"}  # attnviz/__init__.py (the public API); bench.py, evaluate.py (CLIs)
PAGE_MAX, LIBRARY_MAX = 80, 400


def library_files() -> list[Path]:
    return sorted(LIB.rglob("*.py"))


def page_files() -> list[Path]:
    return [ROOT / "app.py"] + sorted((ROOT / "pages").glob("*.py"))


def layer_of(path: Path) -> str | None:
    parts = path.relative_to(LIB).parts
    return parts[0] if len(parts) > 1 else None


def imports(tree: ast.AST):
    """(node, module name, imported names) for every import, with relative imports resolved."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            yield node, ("." * node.level) + (node.module or ""), [a.name for a in node.names]


def attnviz_targets(module: str, names: list[str]) -> list[str]:
    """The attnviz packages an import reaches: `from attnviz.core import model` -> ["core"]."""
    if module == "attnviz":
        return [n for n in names if n in RANK] or ["attnviz"]
    if module.startswith("attnviz."):
        return [module.split(".")[1]]
    return []


def parse(path: Path) -> ast.AST:
    return ast.parse(path.read_text(), filename=str(path))


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_no_relative_imports_so_every_dependency_reads_as_a_path():
    bad = [f"{rel(p)}:{n.lineno}" for p in library_files() for n, mod, _ in imports(parse(p))
           if mod.startswith(".")]
    assert not bad, bad


def test_layers_import_only_downward():
    bad = []
    for path in library_files():
        layer = layer_of(path)
        for node, mod, names in imports(parse(path)):
            for target in attnviz_targets(mod, names):
                if layer is None:  # entry modules: anything but the ui
                    ok = target != "ui" and path.stem in ENTRY
                elif target == "attnviz":
                    ok = False     # the public API sits above every layer
                else:
                    ok = target == layer or RANK.get(target, 99) < RANK[layer]
                if not ok:
                    bad.append(f"{rel(path)}:{node.lineno} imports attnviz.{target}")
    assert not bad, "\n".join(bad)


def test_every_subpackage_states_its_layer():
    for layer in RANK:
        doc = ast.get_docstring(parse(LIB / layer / "__init__.py")) or ""
        assert doc.startswith("Layer") and "Imports:" in doc, layer


@pytest.mark.parametrize("library, allowed", [("streamlit", {"ui"}), ("plotly", {"figures", "ui"}),
                                              ("matplotlib", {"figures", "ui"})])
def test_ui_and_plotting_libraries_stay_in_their_layers(library, allowed):
    bad = [f"{rel(p)}:{n.lineno}" for p in library_files() for n, mod, _ in imports(parse(p))
           if mod.split(".")[0] == library and layer_of(p) not in allowed]
    assert not bad, bad


def test_no_attnviz_import_inside_a_function():
    bad = []
    for path in library_files() + page_files():
        for fn in ast.walk(parse(path)):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node, mod, _ in imports(fn):
                    if mod.startswith(".") or mod == "attnviz" or mod.startswith("attnviz."):
                        bad.append(f"{rel(path)}:{node.lineno}")
    assert not bad, bad


def _module_aliases(tree: ast.AST) -> set[str]:
    """Names bound to attnviz modules: `from attnviz.core import model` binds `model`."""
    out = set()
    for node, mod, names in imports(tree):
        if isinstance(node, ast.Import) and mod.startswith("attnviz"):
            out.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (mod == "attnviz" or mod.startswith("attnviz.")):
            for alias in node.names:
                target = f"{mod}.{alias.name}"
                if (LIB / Path(*target.split(".")[1:])).with_suffix(".py").exists() or \
                        (LIB / Path(*target.split(".")[1:])).is_dir():
                    out.add(alias.asname or alias.name)
    return out


def test_no_private_name_crosses_modules():
    bad = []
    for path in library_files() + page_files():
        tree = parse(path)
        for node, mod, names in imports(tree):
            if mod.startswith("attnviz") or mod.startswith("."):
                bad += [f"{rel(path)}:{node.lineno} imports {n}" for n in names
                        if n.startswith("_") and not n.startswith("__")]
        aliases = _module_aliases(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                bad.append(f"{rel(path)}:{node.lineno} uses {node.value.id}.{node.attr}")
    assert not bad, "\n".join(bad)


def test_pages_are_a_title_and_calls():
    long = {rel(p): n for p in page_files() if (n := len(p.read_text().splitlines())) > PAGE_MAX}
    assert not long, long
    for path in page_files():
        for node, mod, names in imports(parse(path)):
            root = mod.split(".")[0]
            assert root in ("streamlit", "attnviz") and mod in ("streamlit", "attnviz", "attnviz.ui"), \
                f"{rel(path)}:{node.lineno} imports {mod}: pages call attnviz and attnviz.ui only"


def test_a_page_is_a_title_and_one_call():
    """After its title and the import of its one `attnviz.ui` module, a page makes one call: the
    module's `page()`; the layout lives in the ui layer."""
    bad = []
    for path in page_files():
        tree = parse(path)
        uses = {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name) and n.value.id != "st"}
        calls = [n for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                 and not (isinstance(n.value.func, ast.Attribute) and getattr(n.value.func.value, "id", "") == "st")]
        if len(uses) != 1 or len(calls) != 1 or getattr(calls[0].value.func, "attr", "") != "page":
            bad.append(rel(path))
    assert not bad, f"pages that are more than a title and one ui call: {bad}"


def all_python_files() -> list[Path]:
    return library_files() + page_files() + sorted(
        p for folder in ("tests", "bench", "scripts") for p in (ROOT / folder).rglob("*.py"))


def is_attnviz_module(dotted: str) -> bool:
    parts = dotted.split(".")[1:]
    return bool(parts) and ((LIB / Path(*parts)).with_suffix(".py").exists() or (LIB / Path(*parts)).is_dir())


def test_attnviz_modules_are_imported_under_their_own_names():
    """`from attnviz.figures import attention_figures`, never `... import attention as viz`: a
    module reads the same in every file that uses it."""
    bad = []
    for path in all_python_files():
        for node, mod, names in imports(parse(path)):
            if isinstance(node, ast.Import):
                bad += [f"{rel(path)}:{node.lineno} {a.name} as {a.asname}" for a in node.names
                        if a.asname and a.name.startswith("attnviz")]
            elif mod == "attnviz" or mod.startswith("attnviz."):
                bad += [f"{rel(path)}:{node.lineno} {mod}.{a.name} as {a.asname}" for a in node.names
                        if a.asname and is_attnviz_module(f"{mod}.{a.name}")]
    assert not bad, "\n".join(bad)


def test_no_re_export_shims():
    """A name is imported from the module that defines it: no module re-exports another's names
    (`import *`, or imports kept only to be re-exported)."""
    bad = []
    for path in library_files():
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                bad.append(f"{rel(path)}:{node.lineno} import *")
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if "re-export" in line and line.lstrip().startswith(("from ", "import ")):
                bad.append(f"{rel(path)}:{i}")
    assert not bad, bad


def test_every_module_name_says_which_module_it_is():
    """No two library modules share a name (`figures/attention.py` beside `core/attention.py` made
    every reader ask which one): a module's name alone finds its file."""
    seen: dict[str, list[str]] = {}
    for path in library_files():
        if path.stem != "__init__":
            seen.setdefault(path.stem, []).append(rel(path))
    assert not {k: v for k, v in seen.items() if len(v) > 1}


def test_library_files_stay_readable():
    long = {rel(p): n for p in library_files() if (n := len(p.read_text().splitlines())) > LIBRARY_MAX}
    assert not long, long


# What only the Speech page needs (scipy's signal/ndimage, transformers' Whisper feature extractor:
# ~1.5 s of imports) is imported where audio is first decoded, so the first open of any other page
# on a fresh server does not wait for it.
SPEECH_ONLY = ("scipy.signal", "scipy.ndimage", "transformers.models.whisper")


PAGES = ["home_page", "attention_page", "heads_page", "images_page", "lab_page", "latency_page", "translate_page",
         "readouts_page"]
# One process imports what every page shares (none of it speech-only: checked there), then a fresh
# fork per page imports that page: the same check as a fresh interpreter per page, at one start-up.
FIRST_IMPORTS = f"""
import json, os, sys
import torch, transformers, streamlit, plotly, pandas
shared = [m for m in {SPEECH_ONLY!r} if m in sys.modules]
out = {{"(shared imports)": shared}}
for page in {PAGES!r}:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            __import__("attnviz.ui." + page)
            got = [m for m in {SPEECH_ONLY!r} if m in sys.modules]
        except BaseException as e:
            got = ["import failed: " + repr(e)]
        os.write(w, json.dumps(got).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out[page] = json.loads(f.read() or '["no answer"]')
    os.waitpid(pid, 0)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def first_imports() -> dict:
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", FIRST_IMPORTS], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ["(shared imports)", *PAGES])
def test_a_page_imports_only_what_its_first_view_needs(first_imports, module):
    assert first_imports[module] == [], f"attnviz.ui.{module} imports {first_imports[module]} at start-up"


# ---------------------------------------------------------------- one family registry
FAMILY_DIR = LIB / "weights" / "families"


def family_names() -> dict[str, str]:
    """Module stem -> `NAME` of every family file (a module-level `NAME = "..."`)."""
    out = {}
    for path in sorted(FAMILY_DIR.glob("*.py")):
        for node in parse(path).body:
            if (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["NAME"]
                    and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                out[path.stem] = node.value.value
    return out


def module_level_names(tree: ast.Module):
    """(name, value, line) of every module-level assignment."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else []
        for target in targets:
            if isinstance(target, ast.Name):
                yield target.id, node.value, node.lineno


def string_items(value: ast.AST) -> list[str]:
    """The string literals a container literal lists (a dict: its keys)."""
    items = value.keys if isinstance(value, ast.Dict) else \
        value.elts if isinstance(value, (ast.Tuple, ast.List, ast.Set)) else []
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


def test_one_family_registry():
    names = set(family_names().values())
    assert {"bert", "gpt2", "llama", "vit", "dinov2", "marian", "bart", "bergamot", "whisper"} <= names
    registries, lists = [], []
    for path in library_files():
        for name, value, line in module_level_names(parse(path)):
            if "FAMIL" in name.upper():
                registries.append(f"{rel(path)} {name}")
            elif len(set(string_items(value)) & names) >= 2:
                lists.append(f"{rel(path)}:{line} {name} lists family names")
    assert registries == ["attnviz/weights/families/__init__.py FAMILIES"], registries
    assert not lists, lists


def test_every_family_file_is_registered_by_one_line():
    tree = parse(FAMILY_DIR / "__init__.py")
    (registry,) = [v for n, v, _ in module_level_names(tree) if n == "FAMILIES"]
    registered = {n.id for n in ast.walk(registry) if isinstance(n, ast.Name) and n.id != "f"}
    assert registered == set(family_names()), "a family file (one with NAME) missing from FAMILIES, or a reader in it"
    lines = (FAMILY_DIR / "__init__.py").read_text().splitlines()
    assert all(sum(line.strip() == f"{stem}," for line in lines) == 1 for stem in registered), \
        "each family is registered on a line of its own"


def _names_a_family(node: ast.AST) -> bool:
    """`x.family`, `family`, `x["family"]` (and `model_type`): where a family's name is read."""
    keys = {"family", "model_type"}
    return (isinstance(node, ast.Attribute) and node.attr in keys
            or isinstance(node, ast.Name) and node.id in keys
            or isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in keys)


def _is_text(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_text(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def test_no_branch_on_a_family_name_outside_its_file():
    bad = []
    for path in library_files() + page_files():
        if FAMILY_DIR in path.parents:
            continue
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(map(_names_a_family, sides)) and any(map(_is_text, sides)):
                    bad.append(f"{rel(path)}:{node.lineno}")
    assert not bad, f"compare structural config fields, not family names: {bad}"


def test_one_attention_module_and_one_block_runner():
    """Every model's attention is `core.blocks.Attention` and its blocks run in `core.blocks.iter_layers`:
    no other attention class, and no other core module calls `attend` or a block's one-row path."""
    blocks = LIB / "core" / "blocks.py"
    classes, callers = [], []
    for path in library_files():
        tree = parse(path)
        classes += [f"{rel(path)}:{n.lineno} {n.name}" for n in ast.walk(tree)
                    if isinstance(n, ast.ClassDef) and n.name.endswith("Attention") and path != blocks]
        if layer_of(path) == "core" and path not in (blocks, LIB / "core" / "attention.py"):
            callers += [f"{rel(path)}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Call)
                        and getattr(n.func, "attr", getattr(n.func, "id", None)) == "attend"]
            callers += [f"{rel(path)}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Call)
                        and isinstance(n.func, ast.Attribute) and n.func.attr == "step_row"
                        and not (isinstance(n.func.value, ast.Name) and n.func.value.id in ("net", "self"))]
    assert not classes, classes
    assert not callers, callers
