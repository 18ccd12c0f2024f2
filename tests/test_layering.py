"""Import directions between the layers of the source tree, read from every file's imports.

From the ground up:

    ground    the contract (contract, registry, lazy_weights, tiny_tokenizer), file and memory
              helpers (fsutil, paths, memory), shared numerics (metrics) and the package format
              (package/: param files, manifest, reader)
    runtime   the leaf inference library (runtime/): sessions, Mats, caches, masks, RoPE, sampling
    stages    export/, convert/, parity/, reports/: siblings, none imports another
    models    one folder per model (models/<name>/), none imports another; files directly in
              models/ (the shared model kit) serve every folder and import none of them
    app       cli, stages (the orchestrator), nightly, targets and the drivers (ncnnport/drivers/)

A file may import its own layer and the layers below it, never above. Function-level imports
count (a deferred import is still a dependency), and the file-level graph has no cycle.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORDER = ("ground", "runtime", "stages", "models", "app")
GROUND = {"ncnnport", "ncnnport.contract", "ncnnport.registry", "ncnnport.lazy_weights", "ncnnport.tiny_tokenizer",
          "ncnnport.fsutil", "ncnnport.paths", "ncnnport.memory", "ncnnport.metrics"}
APP = {"ncnnport.cli", "ncnnport.stages", "ncnnport.nightly", "ncnnport.targets"}
STAGE_PACKAGES = ("ncnnport.export", "ncnnport.convert", "ncnnport.parity", "ncnnport.reports")
SHARED_MODELS = "ncnnport.models (shared)"


def package_dirs(root: Path) -> dict[str, Path]:
    """Import name -> folder, from pyproject's ``package-dir`` (folders and import names differ)."""
    cfg = tomllib.loads((root / "pyproject.toml").read_text())
    return {k: root / v for k, v in cfg["tool"]["setuptools"]["package-dir"].items()}


def source_modules(root: Path) -> dict[str, Path]:
    """Every source file of the installed packages by its import name."""
    out: dict[str, Path] = {}
    for name, folder in package_dirs(root).items():
        for f in folder.glob("*.py"):
            parts = [] if f.stem == "__init__" else [f.stem]
            out[".".join([name, *parts])] = f
        for sub in sorted(p for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").is_file()):
            if f"{name}.{sub.name}" in package_dirs(root):
                continue
            for f in sub.glob("*.py"):
                parts = [] if f.stem == "__init__" else [f.stem]
                out[".".join([name, sub.name, *parts])] = f
    return out


def layer_of(module: str) -> str:
    """The layer a module belongs to; a new top-level module must be given one here."""
    if module in GROUND or module.startswith("ncnnport.package"):
        return "ground"
    if module.startswith("ncnnport.runtime"):
        return "runtime"
    if module.startswith(STAGE_PACKAGES):
        return "stages"
    if module.startswith("ncnnport.models"):
        return "models"
    if module in APP or module.startswith("ncnnport.drivers"):
        return "app"
    raise AssertionError(f"{module}: no layer assigned (add it to tests/test_layering.py)")


def room(module: str, graph: dict[str, set[str]]) -> str:
    """The folder a stage or model module lives in (``ncnnport.parity``, ``ncnnport.models.seedvr2``):
    siblings of one layer may not import each other. A module directly in models/ (not a model
    folder: one that is no package of other modules) is the models' shared room."""
    parts = module.split(".")
    if module.startswith("ncnnport.models."):
        folder = ".".join(parts[:3])
        is_folder = any(m.startswith(folder + ".") for m in graph)
        return folder if is_folder else SHARED_MODELS
    return ".".join(parts[:2])


def imported(module: str, path: Path, known: set[str]) -> set[str]:
    """Project modules ``path`` imports anywhere in the file (module level or inside functions),
    resolved to files: ``from a.b import c`` is ``a.b.c`` when that is a module, else ``a.b``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                if full in known:
                    out.add(full)
                elif base in known:
                    out.add(base)
    out.discard(module)
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = source_modules(root)
    return {m: imported(m, p, set(modules)) for m, p in modules.items()}


def direction_errors(graph: dict[str, set[str]]) -> list[str]:
    """One line per import that points up a layer, or sideways between stage or model folders."""
    errors = []
    for a, deps in sorted(graph.items()):
        la = ORDER.index(layer_of(a))
        for b in sorted(deps):
            lb = ORDER.index(layer_of(b))
            if lb > la:
                errors.append(f"upward: {a} ({ORDER[la]}) imports {b} ({ORDER[lb]})")
            elif lb == la and ORDER[la] in ("stages", "models") and room(a, graph) != room(b, graph) \
                    and room(b, graph) != SHARED_MODELS:
                errors.append(f"sideways: {a} imports {b} ({ORDER[la]} folders are siblings)")
    return errors


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_import_points_down_or_stays_in_its_room():
    assert direction_errors(import_graph(ROOT)) == []


def test_the_file_import_graph_has_no_cycle():
    assert cycles(import_graph(ROOT)) == []


def test_every_layer_is_populated():
    """The layer map describes the tree: each layer holds files (a rename that empties one fails)."""
    layers = {layer_of(m) for m in source_modules(ROOT)}
    assert layers == set(ORDER)


# --- the checker itself, on small trees -----------------------------------------------------------
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = {"ncnnport" = "ncnnport", "ncnnport.runtime" = "runtime", '
        '"ncnnport.parity" = "parity", "ncnnport.reports" = "reports", "ncnnport.models" = "models"}\n')
    for rel, text in {"ncnnport/__init__.py": "", "runtime/__init__.py": "", "parity/__init__.py": "",
                      "reports/__init__.py": "", "models/__init__.py": "", **files}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


@pytest.mark.parametrize("files, expected", [
    ({"runtime/session.py": "def f():\n    from ncnnport.stages import prepare\n", "ncnnport/stages.py": ""},
     "upward: ncnnport.runtime.session (runtime) imports ncnnport.stages (app)"),
    ({"parity/run.py": "from ncnnport.reports import summary\n", "reports/summary.py": ""},
     "sideways: ncnnport.parity.run imports ncnnport.reports.summary (stages folders are siblings)"),
    ({"models/a/__init__.py": "", "models/a/x.py": "from ..b import y\n",
      "models/b/__init__.py": "", "models/b/y.py": ""},
     "sideways: ncnnport.models.a.x imports ncnnport.models.b.y (models folders are siblings)"),
    ({"models/kit.py": "from ncnnport.models.a import x\n", "models/a/__init__.py": "", "models/a/x.py": ""},
     "sideways: ncnnport.models.kit imports ncnnport.models.a.x (models folders are siblings)"),
])
def test_checker_names_an_upward_or_sideways_import(tmp_path, files, expected):
    assert direction_errors(import_graph(_tree(tmp_path, files))) == [expected]


def test_checker_finds_a_cycle_through_a_deferred_import(tmp_path):
    root = _tree(tmp_path, {"reports/html.py": "from ncnnport.reports.summary import rollup\n",
                            "reports/summary.py": "def write():\n    from ncnnport.reports import html\n"})
    assert cycles(import_graph(root)) == [["ncnnport.reports.html", "ncnnport.reports.summary"]]


def test_model_folders_may_import_the_shared_model_kit(tmp_path):
    root = _tree(tmp_path, {"models/kit.py": "from ncnnport.runtime import masks\n", "runtime/masks.py": "",
                            "models/a/__init__.py": "", "models/a/port.py": "from ncnnport.models.kit import Base\n"})
    assert direction_errors(import_graph(root)) == []
