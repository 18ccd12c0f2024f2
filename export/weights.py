"""Which checkpoint tensors each graph reads, checked against the loaded weights.

Why: a graph whose declared weights match nothing, or a checkpoint tensor no graph reads, is how
a port silently drops part of a model (an unread bias, a forgotten norm) while every local parity
row still passes, since parity runs torch and ncnn over the same wrapper. Every spec declares its
tensors as name patterns (``ModuleSpec.weights``); :func:`bind_weights` resolves them against the
weight source and fails, in one line naming the module and the pattern or tensor, when

* a pattern matches no tensor (a typo, or a module the config does not have), or
* a stored tensor is read by no graph and is not declared unused with a reason.

The resolved names (and the sha256 of the checkpoint files they live in) go into each spec's JSON,
so a package says which weights each graph came from; :func:`spec_weight_bytes` gives the memory
receipts' bytes per graph from the same declarations, and :func:`check_reads` proves at export
that ``build()`` read nothing it did not declare. Nothing here names a model.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ncnnport.contract import ModuleSpec, check_weight_pattern, split_weight_pattern

GLOB_CHARS = "*?["


class WeightCoverageError(ValueError):
    """Declared weights and the loaded checkpoint disagree (one line naming module and tensor)."""


def pattern_matches(name: str, pattern: str) -> bool:
    """A glob matches whole names; a plain pattern matches itself and every name under ``pattern.``."""
    if any(c in pattern for c in GLOB_CHARS):
        return fnmatch.fnmatchcase(name, pattern)
    return name == pattern or name.startswith(pattern + ".")


def select(names: Iterable[str], pattern: str) -> list[str]:
    """The names ``pattern`` (without a row range) matches, in the order given."""
    return [n for n in names if pattern_matches(n, pattern)]


def _resolved(source: Any, names: Iterable[str]) -> list[str]:
    """Stored names behind ``names`` (aliases such as a tied head resolve to their target)."""
    return list(dict.fromkeys(source.resolve(n) for n in names))


def spec_tensors(spec: ModuleSpec, source: Any, names: Sequence[str] | None = None) -> list[str]:
    """The stored tensors ``spec.weights`` names; a pattern matching nothing is an error."""
    names = source.names() if names is None else names
    out: list[str] = []
    for item in spec.weights:
        pattern, rows = split_weight_pattern(item)
        hit = select(names, pattern)
        if not hit:
            raise WeightCoverageError(f"module {spec.name}: weight pattern {item!r} matches no tensor "
                                      f"of {source.describe()}")
        if rows is not None:
            if len(hit) != 1:
                raise WeightCoverageError(f"module {spec.name}: weight pattern {item!r}: a row range "
                                          f"needs one tensor, matched {len(hit)}")
            have = source.shape(hit[0])[0] if source.shape(hit[0]) else 0
            if rows[1] > have:
                raise WeightCoverageError(f"module {spec.name}: weight pattern {item!r}: rows outside "
                                          f"0:{have} of {hit[0]}")
        out.extend(_resolved(source, hit))
    return list(dict.fromkeys(out))


def unclaimed(specs: Sequence[ModuleSpec], source: Any, unused: Mapping[str, str]) -> list[str]:
    """Stored tensors no spec reads and no ``unused`` pattern excuses (patterns checked too)."""
    names = source.names()
    claimed: set[str] = set()
    for spec in specs:
        claimed.update(spec_tensors(spec, source, names))
    for pattern, reason in unused.items():
        check_weight_pattern(pattern, "unused weights")
        if not str(reason).strip():
            raise WeightCoverageError(f"unused weight pattern {pattern!r} gives no reason")
        hit = select(names, pattern)
        if not hit:
            raise WeightCoverageError(f"unused weight pattern {pattern!r} matches no tensor of "
                                      f"{source.describe()}")
        claimed.update(_resolved(source, hit))
    return [n for n in source.stored_names() if n not in claimed]


def bind_weights(specs: Sequence[ModuleSpec], source: Any, unused: Mapping[str, str]) -> None:
    """Check ``specs`` against ``source`` (see the module docstring) and record on each spec the
    stored tensors it reads and the sha256 of the files holding them."""
    left = unclaimed(specs, source, unused)
    if left:
        more = f" (and {len(left) - 1} more)" if len(left) > 1 else ""
        raise WeightCoverageError(
            f"tensor {left[0]!r} of {source.describe()} is read by no graph{more}: add it to the "
            "weights of the module that reads it, or declare it unused with a reason")
    hashes: dict[Path, str] = {}
    names = source.names()
    for spec in specs:
        tensors = spec_tensors(spec, source, names)
        files = sorted({p for p in (source.file_of(t) for t in tensors) if p is not None})
        for path in files:
            if path not in hashes:
                hashes[path] = file_sha256(path)
        spec.weight_tensors = tuple(tensors)
        spec.weight_files = {p.name: hashes[p] for p in files}
        spec.weight_source = source


def spec_weight_bytes(spec: ModuleSpec, source: Any) -> int:
    """float32 bytes of the weights ``spec`` declares (a row range counts only its rows)."""
    names = source.names()
    total, seen = 0, set()
    for item in spec.weights:
        pattern, rows = split_weight_pattern(item)
        for stored in _resolved(source, select(names, pattern)):
            if rows is None and stored in seen:
                continue
            seen.add(stored)
            shape = tuple(int(d) for d in source.shape(stored))
            numel = 1
            for d in (shape[1:] if rows is not None else shape):
                numel *= d
            total += 4 * numel * (rows[1] - rows[0] if rows is not None else 1)
    return total


def check_reads(spec: ModuleSpec, before: Mapping[str, int]) -> None:
    """After ``spec.build()``: the bound source's reads since ``before`` must all be declared and,
    when the build read from the source at all, cover every declared tensor (an over-declared graph
    would count bytes it does not hold)."""
    source = spec.weight_source
    if source is None:
        return
    read = [n for n, k in source.reads.items() if k > before.get(n, 0)]
    extra = sorted(set(read) - set(spec.weight_tensors))
    if extra:
        raise WeightCoverageError(f"module {spec.name}: build() read {len(extra)} tensor(s) its weights "
                                  f"do not declare: {extra[:6]}")
    # a build that read from the source (not a model already built whole) must read all it declares
    unread = sorted(set(spec.weight_tensors) - set(read)) if read else []
    if unread:
        raise WeightCoverageError(f"module {spec.name}: declares {len(unread)} tensor(s) build() never "
                                  f"read: {unread[:6]}")


# --- checkpoint file hashes, cached by (path, size, mtime) -----------------------------------------
def _hash_cache() -> Path:
    from ncnnport.paths import preset_cache_root

    return preset_cache_root() / "sha256"


def file_sha256(path: Path) -> str:
    """sha256 of a checkpoint file; kept under the cache root by path, size and mtime so that an
    8 GB shard is hashed once, not on every run."""
    from ncnnport.fsutil import sha256_file, write_json

    path = Path(path).resolve()
    st = path.stat()
    key = hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    entry = _hash_cache() / f"{key}.json"
    try:
        cached = json.loads(entry.read_text())
        if isinstance(cached, dict) and isinstance(cached.get("sha256"), str):
            return cached["sha256"]
    except (OSError, ValueError):
        pass
    digest = sha256_file(path)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        write_json(entry, {"path": str(path), "size": st.st_size, "sha256": digest})
    except OSError:  # a read-only cache costs a re-hash next time, nothing else
        pass
    return digest


__all__ = ["WeightCoverageError", "bind_weights", "check_reads", "file_sha256", "pattern_matches",
           "select", "spec_tensors", "spec_weight_bytes", "unclaimed"]


def weight_bytes(specs: Sequence[ModuleSpec], source: Any) -> dict[str, int]:
    """Graph name -> float32 bytes of its declared weights (the memory receipts, the bench bounds)."""
    return {s.name: spec_weight_bytes(s, source) for s in specs}


def beyond_layers(names: Iterable[str], template: str, keep: int) -> dict[str, str]:
    """Unused-weight declarations for the layers ``--layers K`` drops from a checkpoint:
    ``template`` ends in ``{i}`` (``"model.layers.{i}"``); every stored layer ``i >= keep`` is
    declared unused with that reason (nothing is returned for a whole model)."""
    if not template.endswith("{i}"):
        raise ValueError(f"layer template {template!r} must end in '{{i}}'")
    head = template[:-len("{i}")]
    found = {int(idx) for idx in (n[len(head):].split(".", 1)[0] for n in names if n.startswith(head))
             if idx.isdigit() and int(idx) >= keep}
    return {f"{head}{i}": f"layer {i}: the build keeps the first {keep} (--layers)" for i in sorted(found)}
