"""Test double shared by the models' perturbation tests: a package copy with one graph's weights
scaled, its manifest rewritten so the package opens (the manifest check would refuse it)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Sequence

import numpy as np

from ncnnport.package.manifest import write_manifest
from ncnnport.fsutil import read_json


def perturbed_package(package: Path, dest: Path, graphs: Sequence[str], factor: float = 1.001) -> Path:
    shutil.copytree(package, dest)
    for graph in graphs:
        weights = dest / "ncnn" / f"{graph}.ncnn.bin"
        data = np.fromfile(weights, dtype=np.float32)
        (data * np.float32(factor)).astype(np.float32).tofile(weights)
    m = read_json(package / "manifest.json")
    write_manifest(dest, model=m["model"], source=m["source"], config_hash=m["config_sha256"],
                   build_key=m["build_key"], commands=m["pnnx_commands"], memory=m.get("memory"))
    return dest
