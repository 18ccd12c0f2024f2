"""Export stage: trace each module spec's wrapper to TorchScript and write its spec JSON.

Every trace is checked at the spec's *second* size against the eager wrapper: a trace that baked
a length (a Python int taken from a shape) fails here, before pnnx ever sees it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ncnnport.contract import ModuleSpec
from ncnnport.fsutil import write_json
from ncnnport.metrics import compare


class ExportError(RuntimeError):
    pass


def _to_tensors(arrays: list[np.ndarray]) -> tuple[Any, ...]:
    import torch
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)


def _as_tuple(result: Any) -> tuple[Any, ...]:
    import torch
    return (result,) if isinstance(result, torch.Tensor) else tuple(result)


def _atomic_jit_save(traced: Any, path: Path) -> None:
    """``torch.jit.save`` straight to a temp file in the same folder, then rename: no in-memory
    copy of the weights (a BytesIO + getvalue() held two), and never a half-written ``.pt``."""
    import torch

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.jit.save(traced, tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def export_module(spec: ModuleSpec, out_dir: Path) -> dict[str, Any]:
    """Trace ``spec`` and write ``<name>.pt`` + ``<name>.spec.json`` into ``out_dir``.

    Returns the spec JSON record (with the trace check's statistics).
    """
    import torch

    from ncnnport.export.weights import check_reads

    before = dict(spec.weight_source.reads) if spec.weight_source is not None else {}
    module = spec.build()
    check_reads(spec, before)
    module.eval()
    trace_inputs = _to_tensors(spec.example_inputs(spec.trace_sizes(0)))
    with torch.inference_mode(False), torch.no_grad():
        eager = _as_tuple(module(*trace_inputs))
        if len(eager) != len(spec.outputs):
            raise ExportError(f"module {spec.name}: wrapper returns {len(eager)} tensors, spec lists "
                              f"{len(spec.outputs)} outputs")
        for t, out in zip(spec.outputs, eager):
            if out.dim() != len(t.shape):
                raise ExportError(f"module {spec.name}, output {t.name}: rank {out.dim()} "
                                  f"{tuple(out.shape)}, spec {t.shape}")
        traced = torch.jit.trace(module, trace_inputs, check_trace=False)
        checks = []
        second = spec.trace_sizes(1)
        check_inputs = _to_tensors(spec.example_inputs(second, seed=1))
        ref = _as_tuple(module(*check_inputs))
        got = _as_tuple(traced(*check_inputs))
        for t, r, g in zip(spec.outputs, ref, got):
            if tuple(r.shape) != tuple(g.shape):
                raise ExportError(f"module {spec.name}, output {t.name}: TorchScript gives shape "
                                  f"{tuple(g.shape)} at sizes {second}, eager {tuple(r.shape)} "
                                  "(a size was baked into the trace)")
            stats = compare(r.numpy(), g.numpy(), what=f"{spec.name}/{t.name}")
            if stats.max_abs > 1e-5 * max(stats.ref_absmax, 1.0):
                raise ExportError(f"module {spec.name}, output {t.name}: TorchScript differs from "
                                  f"eager at sizes {second} (max_abs {stats.max_abs:.3g})")
            checks.append({"output": t.name, "sizes": second, "max_abs": stats.max_abs})
    out_dir.mkdir(parents=True, exist_ok=True)
    _atomic_jit_save(traced, out_dir / f"{spec.name}.pt")
    record = spec.to_json()
    record["torchscript"] = f"{spec.name}.pt"
    record["trace_check"] = checks
    write_json(out_dir / f"{spec.name}.spec.json", record)
    return record
