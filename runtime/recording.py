"""A runner wrapper that records what a module saw and returned during a pipeline run.

Pipelines call ``runner.run(arrays)``; wrapping the torch runners in ``RecordingRunner`` lets
parity feed the ncnn module the exact inputs of the reference run (local parity on real data)
without the pipeline knowing it is being observed.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


class RecordingRunner:
    def __init__(self, inner: Any, limit: int = 64) -> None:
        self.inner = inner
        self.name = inner.name
        self.inputs = inner.inputs
        self.outputs = inner.outputs
        self.limit = limit
        self.calls: list[tuple[list[np.ndarray], list[np.ndarray]]] = []
        self.count = 0

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = self.inner.run(arrays)
        self.count += 1
        if len(self.calls) < self.limit:
            self.calls.append(([np.array(a, copy=True) for a in arrays], [np.array(o, copy=True) for o in out]))
        return out
