"""End-to-end cases shipped in a package: ``cases/<name>/case.json`` plus its input files.

Why: ``verify`` must prove on the target device that the whole pipeline, not only each graph,
gives what the reference gave; the expected values (token ids, frame sha256 and statistics)
were computed by the reference at convert time. ``case.json`` holds ``inputs`` (role -> file
name in the case folder), ``args`` (run options such as ``max_new_tokens``) and ``expected``.

A derived package (fp16 or int8 weights, which legitimately flip near-tied tokens of the seeded
presets) pins ``expected`` to what its own torch-free loop computes, so the C++ loop and another
machine can be compared with it byte for byte; the torch reference's values move to ``reference``
and ``precision`` names the package's weights (:func:`pin_case`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ncnnport.fsutil import read_json, write_json

CASES_DIR = "cases"
CASE_JSON = "case.json"


@dataclass
class PackageCase:
    """One e2e case: input files (name -> bytes), run options and the reference's results."""

    name: str
    files: dict[str, bytes]
    inputs: dict[str, str]
    expected: dict[str, Any]
    args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9_]+", self.name):
            raise ValueError(f"case name {self.name!r}: use lowercase letters, digits, '_'")
        for role, fname in self.inputs.items():
            if fname not in self.files:
                raise ValueError(f"case {self.name}: input {role!r} names {fname!r}, which is not among its files")


def write_case(root: Path, case: PackageCase) -> Path:
    """``cases/<name>/`` with the input files and ``case.json``."""
    folder = Path(root) / CASES_DIR / case.name
    folder.mkdir(parents=True, exist_ok=True)
    for fname, data in case.files.items():
        if "/" in fname or fname in ("", ".", "..", CASE_JSON):
            raise ValueError(f"case {case.name}: bad file name {fname!r}")
        (folder / fname).write_bytes(data)
    write_json(folder / CASE_JSON, {"inputs": case.inputs, "args": case.args, "expected": case.expected})
    return folder


@dataclass(frozen=True)
class CaseOnDisk:
    """A case read back: its folder, input paths by role, run options and expected results."""

    name: str
    folder: Path
    inputs: dict[str, Path]
    args: dict[str, Any]
    expected: dict[str, Any]
    reference: dict[str, Any] | None = None   # the torch reference's values, when expected is pinned
    precision: str | None = None              # the package precision that pinned expected


def read_cases(root: Path) -> list[CaseOnDisk]:
    """Every case of the package at ``root``, in name order; a malformed ``case.json`` or a
    missing input file is a ``ValueError`` naming it."""
    out = []
    for path in sorted((Path(root) / CASES_DIR).glob(f"*/{CASE_JSON}")):
        doc = read_json(path)
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k), dict) for k in ("inputs", "args", "expected")):
            raise ValueError(f"{path}: fields 'inputs', 'args' and 'expected' must be objects")
        inputs = {role: path.parent / str(fname) for role, fname in doc["inputs"].items()}
        for role, p in inputs.items():
            if not p.is_file():
                raise ValueError(f"{p}: missing (input {role!r} of {path})")
        reference = doc.get("reference")
        if reference is not None and not isinstance(reference, dict):
            raise ValueError(f"{path}: field 'reference' must be an object")
        out.append(CaseOnDisk(path.parent.name, path.parent, inputs, doc["args"], doc["expected"],
                              reference, doc.get("precision")))
    return out


def pin_case(case: CaseOnDisk, expected: dict[str, Any], files: dict[str, bytes], precision: str) -> None:
    """Rewrite ``case``'s ``case.json`` with ``expected`` (this package's own results) and its
    ``files`` (e.g. ``expected.png``), keeping the values it held before as ``reference``: the
    torch reference's, also when the case was pinned already."""
    path = case.folder / CASE_JSON
    doc = read_json(path)
    run_inputs = {f for role, f in doc["inputs"].items() if role != "expected"}  # what the loop reads
    for fname, data in files.items():
        if "/" in fname or fname in ("", ".", "..", CASE_JSON) or fname in run_inputs:
            raise ValueError(f"case {case.name}: pinned file {fname!r} is not an expected-output file name")
        (case.folder / fname).write_bytes(data)
    reference = doc.get("reference", doc["expected"])
    write_json(path, {**doc, "expected": expected, "reference": reference, "precision": precision})
