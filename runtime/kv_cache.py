"""Host-side KV cache for graphs that take past K/V as inputs and return the grown cache.

ncnn's in-layer SDPA cache is unusable from Python (opaque, backend-specific layouts), so decode
graphs take every layer's past K/V as plain inputs and return them concatenated with the new
token (``torch.cat`` -> ncnn Concat). This class owns those arrays per session and checks that
each step grew every cache by exactly the number of new tokens along the sequence axis: a graph
that silently dropped or duplicated a step would otherwise decode garbage without an error.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class KVCache:
    def __init__(self, n_tensors: int, seq_axis: int = 2, owner: str = "decoder") -> None:
        self.n_tensors = n_tensors
        self.seq_axis = seq_axis
        self.owner = owner
        self.tensors: list[np.ndarray] = []
        self.length = 0

    def reset(self) -> None:
        self.tensors = []
        self.length = 0

    def set(self, tensors: Sequence[np.ndarray], added: int) -> None:
        """Take the graph's returned caches; they must be ``length + added`` long."""
        if len(tensors) != self.n_tensors:
            raise ValueError(f"{self.owner}: got {len(tensors)} cache tensors, expected {self.n_tensors}")
        want = self.length + added
        for i, t in enumerate(tensors):
            if t.shape[self.seq_axis] != want:
                raise ValueError(f"{self.owner}: cache tensor {i} has length {t.shape[self.seq_axis]} "
                                 f"after adding {added} to {self.length}; expected {want}")
        self.tensors = [np.ascontiguousarray(t) for t in tensors]
        self.length = want

    def inputs(self) -> list[np.ndarray]:
        if not self.tensors:
            raise RuntimeError(f"{self.owner}: decode before prefill (empty cache)")
        return self.tensors

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)
