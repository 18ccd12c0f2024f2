"""Package manifest: what a converted model folder must contain, byte for byte.

``manifest.json`` lists sha256 and size of every artifact (relative paths only), the tool
versions, the exact pnnx command lines and the model config hash. ``check_package`` verifies a
folder against it: missing, extra and changed files, and unsafe paths.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
from pathlib import Path, PurePosixPath
from typing import Any, Mapping, Sequence

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
                   commands: list[dict[str, Any]], memory: dict[str, Any] | None = None,
                   modules: Sequence[str] | None = None) -> dict[str, Any]:
    """Hash every artifact under ``root`` into ``manifest.json``; ``modules`` is the model's full
    module list, so that a package later missing graphs (with a manifest rewritten to match)
    still fails ``check_package``."""
    files = {p.relative_to(root).as_posix(): {"sha256": sha256_file(p), "size": p.stat().st_size}
             for p in artifact_files(root)}
    manifest = {"schema": SCHEMA, "model": model, "source": source, "config_sha256": config_hash,
                "build_key": build_key, "versions": tool_versions(), "pnnx_commands": commands,
                "files": files}
    if modules is not None:
        manifest["modules"] = list(modules)
    if memory is not None:
        manifest["memory"] = memory  # measured peak RSS per stage (see ncnnport.stages)
    write_json(root / MANIFEST, manifest)
    return manifest


def _unsafe(rel: str) -> bool:
    p = PurePosixPath(rel)
    return p.is_absolute() or ".." in p.parts or "\\" in rel or rel.startswith("~")


class ManifestError(ValueError):
    """A manifest that cannot be read or has fields of the wrong JSON type (names file and field)."""


def load_manifest(path: Path) -> dict[str, Any]:
    """The manifest at ``path`` with its structure checked: ``files`` an object of
    ``{"sha256": str, "size": int}`` entries, ``pnnx_commands`` a list of objects."""
    try:
        manifest = read_json(path)
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(manifest, dict):
        raise ManifestError(f"{path}: manifest must be a JSON object, got {type(manifest).__name__}")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise ManifestError(f"{path}: field 'files' must be an object, got {type(files).__name__}")
    for rel, meta in files.items():
        if not (isinstance(meta, dict) and isinstance(meta.get("sha256"), str)
                and isinstance(meta.get("size"), int) and not isinstance(meta.get("size"), bool)):
            raise ManifestError(f"{path}: field 'files'[{rel!r}] must be {{\"sha256\": string, \"size\": integer}}, "
                                f"got {json.dumps(meta)[:80]}")
    commands = manifest.get("pnnx_commands", [])
    if not isinstance(commands, list) or not all(isinstance(c, dict) for c in commands):
        raise ManifestError(f"{path}: field 'pnnx_commands' must be a list of objects")
    modules = manifest.get("modules")
    if modules is not None and not (isinstance(modules, list) and all(isinstance(m, str) for m in modules)):
        raise ManifestError(f"{path}: field 'modules' must be a list of strings")
    return manifest


def package_modules(files: Mapping[str, Any]) -> set[str]:
    """Module names a package holds: one ``specs/<name>.spec.json`` per converted graph."""
    return {rel[len("specs/"): -len(".spec.json")] for rel in files
            if rel.startswith("specs/") and rel.endswith(".spec.json") and rel.count("/") == 1}


def module_problems(manifest: Mapping[str, Any], expected: Sequence[str] | None) -> list[str]:
    """Graphs missing from a package. The module list is ``expected`` (the port's specs, when the
    caller knows the model), else the manifest's own ``modules`` (recorded at build time), else
    the modules its pnnx commands name; each needs its param and bin, and a spec JSON where the
    list came from the port or the manifest's module list."""
    files = manifest["files"]
    if expected is not None:
        wanted, need_spec = list(expected), True
    elif isinstance(manifest.get("modules"), list):
        wanted, need_spec = [str(m) for m in manifest["modules"]], True
    else:
        wanted, need_spec = [str(c["module"]) for c in manifest.get("pnnx_commands", []) if c.get("module")], False
    out = []
    absent = [m for m in wanted if f"ncnn/{m}.ncnn.param" not in files or f"ncnn/{m}.ncnn.bin" not in files
              or (need_spec and f"specs/{m}.spec.json" not in files)]
    if absent:
        out.append(f"holds {len(wanted) - len(absent)} of {len(wanted)} modules; missing: {', '.join(absent[:8])}"
                   + (f" and {len(absent) - 8} more" if len(absent) > 8 else ""))
    if need_spec:
        extra = sorted(package_modules(files) - set(wanted))
        if extra:
            out.append(f"modules not in the module list: {', '.join(extra[:8])}")
    return out


def check_package(root: Path, expected: Sequence[str] | None = None) -> list[str]:
    """Problems found (empty when the package matches its manifest exactly and holds every
    module of ``expected``, the model's module list; without it, every module its pnnx commands
    name)."""
    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        return [f"{path}: no manifest"]
    try:
        manifest = load_manifest(path)
    except ManifestError as exc:
        return [str(exc)]
    files = manifest["files"]
    problems = module_problems(manifest, expected)
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
