"""Reading a converted package: the manifest check and each graph's files and spec JSON.

Every consumer of a package (the CLI's ``run``, parity, benches, ``LazyModules``) opens it
through :func:`open_package`, so a package that does not match its manifest is refused in one
place, before any graph is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ncnnport.fsutil import read_json
from ncnnport.package.manifest import check_package

SPEC_SUFFIX = ".spec.json"


@dataclass(frozen=True)
class PackageReader:
    """A checked package folder: its graph names and the spec JSON of each graph."""

    folder: Path
    specs: dict[str, dict[str, Any]]

    def param(self, name: str) -> Path:
        """The graph's ``.ncnn.param`` file."""
        return self.folder / "ncnn" / f"{name}.ncnn.param"

    def bin(self, name: str) -> Path:
        """The graph's ``.ncnn.bin`` weights."""
        return self.folder / "ncnn" / f"{name}.ncnn.bin"

    def select(self, names: Sequence[str] | None) -> dict[str, dict[str, Any]]:
        """The specs of ``names`` (all graphs when None); an unknown name is an error naming it."""
        if names is None:
            return dict(self.specs)
        unknown = [n for n in names if n not in self.specs]
        if unknown:
            raise KeyError(f"package {self.folder} has no graphs {unknown}")
        return {n: self.specs[n] for n in names}


def open_package(folder: Path) -> PackageReader:
    """Check ``folder`` against its manifest and read every graph's spec JSON; a mismatch is one
    ``RuntimeError`` listing the problems (nothing half-opened)."""
    folder = Path(folder)
    problems = check_package(folder)
    if problems:
        raise RuntimeError(f"package {folder} does not match its manifest:\n  " + "\n  ".join(problems))
    return checked_reader(folder)


def checked_reader(folder: Path) -> PackageReader:
    """The reader of a package the caller has JUST checked with ``check_package`` (``verify``,
    ``run --package``): hashing a multi-GB package once is enough."""
    folder = Path(folder)
    specs = {p.name[: -len(SPEC_SUFFIX)]: read_json(p) for p in sorted((folder / "specs").glob("*" + SPEC_SUFFIX))}
    return PackageReader(folder, specs)
