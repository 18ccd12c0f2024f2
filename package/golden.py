"""Golden vectors: one ``golden/<module>.npz`` per graph with its inputs and reference outputs.

Why: a deployer checks a target device with the package alone (``ncnnport verify``), so each
graph ships the exact inputs it was traced at and what PyTorch computed for them. Arrays only:
files are read with ``allow_pickle=False`` (an object array is refused, never unpickled).
Keys: ``case{k}/sizes`` (axis values, int64, in ``case{k}/axes`` order), ``case{k}/in{i}``,
``case{k}/out{j}``.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

GOLDEN_DIR = "golden"


@dataclass(frozen=True)
class GoldenCase:
    """One call of a graph: the axis sizes, its inputs and the reference outputs."""

    sizes: dict[str, int]
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]


def golden_path(root: Path, module: str) -> Path:
    return Path(root) / GOLDEN_DIR / f"{module}.npz"


def write_golden(path: Path, cases: Sequence[GoldenCase]) -> None:
    """Write ``cases`` to ``path`` (uncompressed npz, deterministic key order)."""
    arrays: dict[str, np.ndarray] = {}
    for k, case in enumerate(cases):
        axes = sorted(case.sizes)
        arrays[f"case{k}/axes"] = np.array(axes, dtype=np.str_)
        arrays[f"case{k}/sizes"] = np.array([case.sizes[a] for a in axes], dtype=np.int64)
        arrays.update({f"case{k}/in{i}": np.ascontiguousarray(a) for i, a in enumerate(case.inputs)})
        arrays.update({f"case{k}/out{j}": np.ascontiguousarray(a) for j, a in enumerate(case.outputs)})
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path.write_bytes(buf.getvalue())


def _indexed(data: Mapping[str, np.ndarray], prefix: str) -> list[np.ndarray]:
    out, i = [], 0
    while f"{prefix}{i}" in data:
        out.append(data[f"{prefix}{i}"])
        i += 1
    return out


def read_golden(path: Path) -> list[GoldenCase]:
    """The cases in ``path``; a file that is not a pickle-free npz of this layout is a
    ``ValueError`` naming it."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            data = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"{path}: not a golden-vector file ({exc})") from None
    cases, k = [], 0
    while f"case{k}/sizes" in data:
        axes = [str(a) for a in data.get(f"case{k}/axes", np.array([], dtype=np.str_))]
        sizes = {a: int(n) for a, n in zip(axes, data[f"case{k}/sizes"])}
        cases.append(GoldenCase(sizes, _indexed(data, f"case{k}/in"), _indexed(data, f"case{k}/out")))
        k += 1
    if not cases:
        raise ValueError(f"{path}: holds no golden cases")
    return cases
