"""The peer column of ``bench --perf``: ONNX Runtime's CPU execution provider on the same graphs.

A PC user who does not pick ncnn picks ONNX Runtime, so the speed table times it on the same
work: the bench module names, per stage, the graphs one call runs (``bench_peer_graphs``: module
name and axis sizes, e.g. every ``decode_layer{i}`` at ``past=P``); each graph is the very torch
wrapper the ncnn graph was converted from (``ModuleSpec.build``), exported with
``torch.onnx.export`` at the benched sizes and run with the spec's own example inputs at the
bench's thread count. The peer runs the graphs only (no host loop around them), always in fp32.
Anything that stops the peer (onnxruntime missing, an export the exporter refuses) is one line
in the table's cell, never an abort of the table.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

Call = Callable[[], Any]
NO_GRAPHS = "no ONNX peer graphs declared for this stage"


def session_options(threads: int) -> Any:
    """ORT options matching the bench: ``threads`` intra-op threads, one inter-op thread,
    sequential execution, full graph optimisation (ORT's default for a user), and pool threads
    that sleep instead of spinning after a call: the table interleaves runtimes call by call, and
    a spinning pool would hold the cores the next runtime's call needs."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


@contextlib.contextmanager
def _quiet_fds() -> Iterator[None]:
    """stdout and stderr (the file descriptors: the exporter prints from C++) sent to a scratch
    file for the body: on a refusal the exporter prints the whole graph, which would bury the
    speed table; the reason still reaches the cell through the exception."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def export_onnx(spec: Any, inputs: Sequence[np.ndarray], path: Path) -> Path:
    """The spec's torch wrapper exported to ``path`` at the shapes of ``inputs`` (static shapes:
    one file per benched size). Reused when already there."""
    import torch

    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    module = spec.build()
    args = tuple(torch.from_numpy(np.ascontiguousarray(x)) for x in inputs)
    tmp = path.with_suffix(".partial")
    with torch.no_grad(), warnings.catch_warnings(), _quiet_fds():
        # the TorchScript exporter (no onnxscript needed) warns that it is the legacy one
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module, args, str(tmp), input_names=[t.name for t in spec.inputs],
                          output_names=[t.name for t in spec.outputs], opset_version=17, dynamo=False)
    tmp.replace(path)
    return path


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


def peer_call(specs: Mapping[str, Any], graphs: Sequence[tuple[str, Mapping[str, int]]] | None,
              threads: int, workdir: Path) -> tuple[Call | None, str]:
    """A zero-argument call running ``graphs`` in ONNX Runtime, or None and why not."""
    if not graphs:
        return None, NO_GRAPHS
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "onnxruntime not installed (pip install 'ncnnport[bench]')"
    runs = []
    for name, sizes in graphs:
        spec = specs.get(name)
        if spec is None:
            return None, f"no graph {name!r} in the split"
        try:
            inputs = spec.example_inputs(dict(sizes))
        except ValueError as exc:
            return None, f"inputs of {name} at {dict(sizes)}: {_one_line(exc)}"
        tag = "-".join(f"{k}{v}" for k, v in sorted(sizes.items())) or "static"
        try:
            path = export_onnx(spec, inputs, workdir / f"{name}-{tag}.onnx")
        except Exception as exc:  # the exporter's refusal is the cell's content
            return None, f"torch.onnx.export of {name} failed: {_one_line(exc)}"
        try:
            session = ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
        except Exception as exc:
            return None, f"onnxruntime cannot load {name}: {_one_line(exc)}"
        wanted = {i.name for i in session.get_inputs()}
        feeds = {t.name: x for t, x in zip(spec.inputs, inputs) if t.name in wanted}
        runs.append((session, feeds))

    def call() -> list[Any]:
        return [session.run(None, feeds)[0] for session, feeds in runs]
    return call, ""
