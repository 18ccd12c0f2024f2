"""Package manifest: what a converted model folder must contain, byte for byte.

``manifest.json`` lists sha256 and size of every artifact (relative paths only), the tool
versions, the exact pnnx command lines and the model config hash. ``check_package`` verifies a
folder against it: missing, extra and changed files, and unsafe paths.
"""

from __future__ import annotations

import importlib.metadata
import platform
from pathlib import Path, PurePosixPath
from typing import Any

from ncnnport.fsutil import read_json, sha256_file, write_json

MANIFEST = "manifest.json"
SCHEMA = 1
TRACKED_PACKAGES = ("torch", "transformers", "pnnx", "ncnn", "numpy", "ncnnport")


def tool_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in TRACKED_PACKAGES:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def artifact_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST
                  and not any(part.startswith(".") for part in p.relative_to(root).parts))


def write_manifest(root: Path, *, model: str, source: str, config_hash: str, build_key: str,
                   commands: list[dict[str, Any]], memory: dict[str, Any] | None = None) -> dict[str, Any]:
    files = {p.relative_to(root).as_posix(): {"sha256": sha256_file(p), "size": p.stat().st_size}
             for p in artifact_files(root)}
    manifest = {"schema": SCHEMA, "model": model, "source": source, "config_sha256": config_hash,
                "build_key": build_key, "versions": tool_versions(), "pnnx_commands": commands,
                "files": files}
    if memory is not None:
        manifest["memory"] = memory  # measured peak RSS per stage (see ncnnport.stages)
    write_json(root / MANIFEST, manifest)
    return manifest


def _unsafe(rel: str) -> bool:
    p = PurePosixPath(rel)
    return p.is_absolute() or ".." in p.parts or "\\" in rel or rel.startswith("~")


def check_package(root: Path) -> list[str]:
    """Problems found (empty when the package matches its manifest exactly)."""
    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        return [f"{path}: no manifest"]
    try:
        manifest = read_json(path)
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as exc:
        return [f"{path}: unreadable manifest ({exc})"]
    problems = []
    resolved_root = root.resolve()
    for rel, meta in files.items():
        if _unsafe(rel):
            problems.append(f"unsafe path in manifest: {rel!r}")
            continue
        p = root / rel
        if p.is_symlink() or not p.resolve().is_relative_to(resolved_root):
            problems.append(f"{rel}: link or path leaving the package")
            continue
        if not p.is_file():
            problems.append(f"{rel}: missing")
            continue
        size = p.stat().st_size
        if size != meta.get("size"):
            problems.append(f"{rel}: size {size}, manifest {meta.get('size')}")
        elif sha256_file(p) != meta.get("sha256"):
            problems.append(f"{rel}: sha256 differs from manifest")
    listed = set(files)
    for p in artifact_files(root):
        rel = p.relative_to(root).as_posix()
        if rel not in listed:
            problems.append(f"{rel}: extra file not in manifest")
    return problems
