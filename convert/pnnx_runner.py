"""Run pnnx on one exported module and turn its output into a checked ncnn graph.

The command line is built from the spec alone: ``inputshape`` from the first size of every
dynamic axis, ``inputshape2`` from the second, ``fp16=0`` unless a precision mode asks for fp16
weights. pnnx exits 0 on graphs ncnn cannot load, so its output is always parsed and gated.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from ncnnport.contract import (patches_from_json, tensor_specs_from_json, variant_param_name,
                               variants_from_json)
from ncnnport.package.param_file import ParamError, check_loadable, read_param
from ncnnport.convert.patches import apply_patches
from ncnnport.convert.rewrites import apply_rewrites

PNNX_DTYPES = {"float32": "f32", "int32": "i32"}


class ConvertError(RuntimeError):
    pass


class Terminated(BaseException):
    """SIGTERM arrived: raised like KeyboardInterrupt so that every ``finally`` runs (the pnnx
    child is killed, its temp folder removed) before the process exits."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(f"terminated by signal {signum}")


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While converting, SIGTERM raises :class:`Terminated` instead of killing the interpreter on
    the spot (which would orphan pnnx and leave its work folder behind). SIGINT already raises
    KeyboardInterrupt. Only the main thread may set handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def pnnx_executable() -> str:
    import pnnx
    return str(pnnx.EXEC_PATH)


def shape_arg(spec: Mapping[str, Any], sizes: Mapping[str, int]) -> str:
    parts = []
    for t in tensor_specs_from_json(spec["inputs"]):
        dims = ",".join(str(d) for d in t.concrete(sizes))
        parts.append(f"[{dims}]{PNNX_DTYPES[t.dtype]}")
    return ",".join(parts)


def pnnx_args(spec: Mapping[str, Any], *, fp16_weights: bool = False) -> list[str]:
    """pnnx arguments (without the executable and .pt path), derived from the spec only."""
    axes = {k: tuple(v) for k, v in spec["axes"].items()}
    first = {k: v[0] for k, v in axes.items()}
    args = [f"inputshape={shape_arg(spec, first)}"]
    if any(v[1] is not None for v in axes.values()):
        second = {k: (v[1] if v[1] is not None else v[0]) for k, v in axes.items()}
        args.append(f"inputshape2={shape_arg(spec, second)}")
    args += ["device=cpu", "optlevel=2", f"fp16={1 if fp16_weights else 0}"]
    return args


def _rename_blobs(graph, mapping: Mapping[str, str], *, module: str) -> None:
    """pnnx names graph inputs in0.. and outputs out0..; give them the spec's names."""
    existing = graph.blob_names()
    for old, new in mapping.items():
        if old not in existing:
            kind = "input" if old.startswith("in") else "output"
            raise ConvertError(f"module {module}: pnnx produced no blob {old!r} for {kind} {new!r} "
                               "(an unused input is dropped by pnnx; remove it from the wrapper)")
        if new in existing and new not in mapping:
            raise ConvertError(f"module {module}: blob name {new!r} collides with a pnnx blob")
    for layer in graph.layers:
        layer.inputs = [mapping.get(b, b) for b in layer.inputs]
        layer.outputs = [mapping.get(b, b) for b in layer.outputs]
        if layer.type == "Input" and layer.name in mapping:
            layer.name = mapping[layer.name]


def convert_module(spec: Mapping[str, Any], torchscript: Path, out_dir: Path, *,
                   fp16_weights: bool = False, keep_workdir: Path | None = None) -> dict[str, Any]:
    """Convert one module; writes ``<name>.ncnn.param`` / ``.ncnn.bin`` to ``out_dir``.

    Returns a receipt: the exact pnnx command (relative names), exit code, duration, layer
    type counts and the patches applied.
    """
    name = spec["name"]
    args = pnnx_args(spec, fp16_weights=fp16_weights)
    out_dir.mkdir(parents=True, exist_ok=True)
    with sigterm_raises(), tempfile.TemporaryDirectory(prefix=f"pnnx-{name}-") as tmp:
        work = Path(tmp)
        local_pt = work / f"{name}.pt"
        try:  # a hard link costs no copy of a multi-GB TorchScript file
            os.link(torchscript, local_pt)
        except OSError:
            shutil.copyfile(torchscript, local_pt)
        cmd = [pnnx_executable(), local_pt.name, *args]
        t0 = time.perf_counter()
        returncode, output, pnnx_peak = _run_measured(
            cmd, work, {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        seconds = time.perf_counter() - t0
        param, weights = work / f"{name}.ncnn.param", work / f"{name}.ncnn.bin"
        if returncode != 0 or not param.is_file() or not weights.is_file():
            tail = output[-2000:]
            raise ConvertError(f"module {name}: pnnx exited {returncode} without an ncnn graph\n{tail}")
        graph = read_param(param)
        try:
            check_loadable(graph, module=name)
        except ParamError:
            if keep_workdir is not None:
                shutil.copytree(work, keep_workdir / name, dirs_exist_ok=True)
            raise
        mapping = {f"in{i}": t["name"] for i, t in enumerate(spec["inputs"])}
        mapping.update({f"out{i}": t["name"] for i, t in enumerate(spec["outputs"])})
        _rename_blobs(graph, mapping, module=name)
        receipts = apply_patches(graph, patches_from_json(spec.get("patches", [])), module=name)
        graph.write(out_dir / f"{name}.ncnn.param")
        variants = write_variants(graph, spec, out_dir)
        _atomic_copy(weights, out_dir / f"{name}.ncnn.bin")
        if keep_workdir is not None:
            shutil.copytree(work, keep_workdir / name, dirs_exist_ok=True)
    counts: dict[str, int] = {}
    for t in graph.layer_types():
        counts[t] = counts.get(t, 0) + 1
    return {"module": name, "command": ["pnnx", f"{name}.pt", *args], "returncode": returncode,
            "seconds": round(seconds, 3), "pnnx_peak_rss_mb": round(pnnx_peak / 2**20, 1),
            "layer_types": dict(sorted(counts.items())), "patches": receipts, "variants": variants}


def write_variants(graph, spec: Mapping[str, Any], out_dir: Path) -> list[dict[str, Any]]:
    """Write each of the spec's graph variants (``<name>.<variant>.ncnn.param``, sharing
    ``<name>.ncnn.bin``): the patched graph with the variant's rewrites; one receipt each."""
    name = spec["name"]
    out = []
    for variant in variants_from_json(spec.get("variants", [])):
        derived = copy.deepcopy(graph)
        receipts = apply_rewrites(derived, variant.rewrites, module=f"{name}.{variant.name}")
        check_loadable(derived, module=f"{name}.{variant.name}")
        derived.write(out_dir / variant_param_name(name, variant.name))
        out.append({"variant": variant.name, "param": variant_param_name(name, variant.name),
                    "rewrites": receipts})
    return out


def _run_measured(cmd: list[str], cwd: Path, env: Mapping[str, str]) -> tuple[int, str, int]:
    """Run ``cmd``; (exit code, stdout+stderr, the child's peak RSS in bytes).

    The peak is the child's ``VmHWM`` sampled every 20 ms (monotonic, so the last sample is the
    peak up to its final 20 ms). ``wait4``'s ru_maxrss is no use here: a forked child inherits
    the parent's resident size before ``exec``, so every child would report at least ours.
    """
    from ncnnport.memory import child_peak_rss_bytes

    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=dict(env))
        peak = 0
        try:
            while True:
                peak = max(peak, child_peak_rss_bytes(proc.pid))
                try:
                    rc = proc.wait(timeout=0.02)
                    break
                except subprocess.TimeoutExpired:
                    continue
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        return rc, out.read().decode(errors="replace"), peak


def _atomic_copy(src: Path, dest: Path) -> None:
    """Copy via a temp file + rename: an interrupted copy never looks like a finished one."""
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
