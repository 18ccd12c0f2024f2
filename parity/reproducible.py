"""Reproducible PyTorch references: a fixed thread count and deterministic algorithms, set and
restored around the reference computations of parity.

Why: a CPU reduction split over N threads sums in an N-dependent order, so the same reference
computed under a different ambient ``torch.set_num_threads`` differs in its last bits; a parity
number must not depend on what an earlier model or the user's shell set. Restoring matters as
much: a setting made for one model's reference must not leak into the next model's run.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

# fixed, not "all cores": bit-identical references across runs and across machines' core counts
REFERENCE_THREADS = 1


@contextlib.contextmanager
def deterministic_reference(threads: int = REFERENCE_THREADS) -> Iterator[dict[str, Any]]:
    """Run the body with ``threads`` intra-op threads and deterministic algorithms (warn-only, so
    a CPU op without a deterministic kernel warns instead of failing); yields the record that
    goes into the summary, and restores the ambient settings on exit, error or not."""
    if threads < 1:
        raise ValueError(f"reference threads must be >= 1, got {threads}")
    saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled())
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield {"torch_threads": threads, "deterministic_algorithms": True}
    finally:
        torch.set_num_threads(saved[0])
        torch.use_deterministic_algorithms(saved[1], warn_only=saved[2])
