"""Where a model's artifacts live, and whether they are up to date.

``build/<model>/<tag>/`` holds ``torchscript/`` (export stage), ``package/`` (the ncnn package:
graphs, spec JSON, assets, manifest) and ``state.json`` (the build key each stage last
completed with). ``tag`` is the preset name, or ``ckpt-<hash>`` for a checkpoint folder, with
``-L<K>`` when only the first K layers are kept.
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass
from pathlib import Path

from ncnnport.paths import DEFAULT_BUILD_ROOT
from ncnnport.registry import KNOWN_MODELS

GENERIC_STAGE_PACKAGES = ("ncnnport.export", "ncnnport.convert", "ncnnport.package", "ncnnport.contract", "ncnnport.lazy_weights")


@dataclass(frozen=True)
class Target:
    model: str
    preset: str = "tiny"
    ckpt: Path | None = None
    build_root: Path = DEFAULT_BUILD_ROOT
    layers: int | None = None  # keep the first K layers (models with ``supports_layers``)

    @property
    def tag(self) -> str:
        suffix = f"-L{self.layers}" if self.layers is not None else ""
        if self.ckpt is None:
            return self.preset + suffix
        digest = hashlib.sha256(str(Path(self.ckpt).resolve()).encode()).hexdigest()[:10]
        return f"ckpt-{digest}{suffix}"

    @property
    def root(self) -> Path:
        return self.build_root / self.model / self.tag

    @property
    def torchscript_dir(self) -> Path:
        return self.root / "torchscript"

    @property
    def package_dir(self) -> Path:
        return self.root / "package"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def report_dir(self) -> Path:
        suffix = "" if self.tag == "tiny" else f"-{self.tag}"
        return self.build_root / "reports" / f"{self.model}{suffix}"

    @property
    def source(self) -> str:
        base = f"ckpt:{Path(self.ckpt).name}" if self.ckpt else f"preset:{self.preset}"
        return base + (f" layers:{self.layers}" if self.layers is not None else "")


def bench_only(path: Path) -> bool:
    """A model folder's measurement module (``bench.py``, ``cpp_bench.py``, ``vision_bench.py``,
    ``tile_measure.py``: names holding ``bench`` or ending in ``_measure``): imported only by the
    bench verbs, never by export or convert, so it stays out of the build key. Editing one used to
    re-export and re-convert a real-width package (27 min for SeedVR2 real-L4 here)."""
    return path.suffix == ".py" and ("bench" in path.stem or path.stem.endswith("_measure"))


def _code_files(model: str) -> list[tuple[str, Path]]:
    """(label, file) of every source file the build key covers: the model folder (less its
    measurement modules, ``bench_only``) and the generic export/convert code, in a stable order."""
    folders = [Path(importlib.import_module(KNOWN_MODELS[model].rsplit(".", 1)[0]).__file__).parent]
    for pkg in GENERIC_STAGE_PACKAGES:
        mod = importlib.import_module(pkg)
        path = Path(mod.__file__)
        folders.append(path.parent if path.name == "__init__.py" else path)
    out: list[tuple[str, Path]] = []
    for f in folders:
        if f.is_dir():
            out += [(p.relative_to(f).as_posix(), p) for p in sorted(f.rglob("*"))
                    if p.is_file() and p.suffix in (".py", ".json", ".txt", ".jinja") and "__pycache__" not in p.parts
                    and not bench_only(p)]
        else:
            out.append(("", f))
    return out


def code_hash(model: str) -> str:
    """Hash of the model folder's and the generic export/convert code: a change re-exports."""
    h = hashlib.sha256()
    for label, path in _code_files(model):
        h.update(label.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def code_file_hashes(model: str) -> dict[str, str]:
    """sha256 per source file under the build key, so a rebuild can name the file that changed."""
    root = Path(importlib.import_module("ncnnport").__file__).parent.parent
    out = {}
    for _, path in _code_files(model):
        try:
            name = path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            name = str(path)
        out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def checkpoint_fingerprint(ckpt: Path | None) -> str:
    """Names, sizes and mtimes of a checkpoint folder's files (hashing 8 GB per run is too slow)."""
    if ckpt is None:
        return "none"
    h = hashlib.sha256()
    for p in sorted(Path(ckpt).iterdir()):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()
