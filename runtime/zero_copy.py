"""Feed ncnn graphs numpy views of ncnn-owned memory without copying them.

Two facts of ncnn python 1.0.20261020 (measured; see tests/runtime/test_zero_copy.py):

* ``ncnn.Mat(array, batch_index=0)`` COPIES (a ``take().copy()`` per batch item plus a
  ``memcpy``), so every input of :class:`~ncnnport.runtime.session.NcnnModule` is copied twice.
  Harmless for a hidden state; for a decode graph's past K/V it is a copy of the whole cache per
  layer per token.
* ``ncnn.Mat(array)`` without ``batch_index`` borrows the buffer but has no reference count, and
  ``Net`` (light mode) dereferences the count of any input that feeds an in-place layer:
  segfault. A header copied from an ncnn-OWNED Mat (``ncnn.Mat(owner)``) shares the owner's
  count instead; ncnn then clones before an in-place write, so the memory is never modified.

:func:`ncnn_view` turns a numpy view of an ncnn-owned 3-D Mat (such as
:class:`~ncnnport.runtime.preallocated_cache.PreallocatedKVCache`'s ``past``) into such a
header, when the view starts at the Mat's first element and covers whole rows of every channel.
:class:`ZeroCopyRunner` wraps an ``NcnnModule`` with the same interface and checks, borrowing
those inputs and copying every other one exactly as ``NcnnModule`` does.

On a Vulkan net nothing is borrowed: ncnn's upload (``VkCompute::record_upload``, 1.0.20261020)
sizes its staging buffer from the header's dims (a compact ``cstep``) but copies
``total() = cstep * c`` of the source, and a view's ``cstep`` is the owner's (full capacity), so
the upload writes past the staging buffer: heap corruption ("malloc(): unsorted double linked
list corrupted" on lavapipe, youtu-vl decode). The upload copies anyway, so nothing is lost.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np



def _owner(array: np.ndarray) -> tuple[Any, np.ndarray] | None:
    """The ncnn Mat whose buffer ``array`` is a view of, and the numpy array exported from it."""
    import ncnn

    base, exported = array, None
    for _ in range(64):  # a view chain is short; never loop on a pathological one
        if isinstance(base, np.ndarray):
            exported, base = base, base.base
        elif isinstance(base, memoryview):
            return (base.obj, exported) if isinstance(base.obj, ncnn.Mat) else None
        else:
            return None
    return None


def ncnn_view(array: np.ndarray) -> Any | None:
    """An ncnn Mat header over ``array``'s memory, or None when ``array`` is not a whole-row view
    ``[1, c, h, w]`` (``h`` <= the owner's) from the start of an ncnn-owned 3-D float32 Mat."""
    if not isinstance(array, np.ndarray) or array.ndim != 4 or array.shape[0] != 1 or array.dtype != np.float32:
        return None
    found = _owner(array)
    if found is None:
        return None
    owner, exported = found
    import ncnn

    if owner.dims != 3 or owner.elempack != 1 or owner.elemsize != 4:
        return None
    _, c, h, w = array.shape
    start = exported.__array_interface__["data"][0]
    if (array.__array_interface__["data"][0] != start or c != owner.c or w != owner.w or h > owner.h
            or array.strides[1:] != (owner.cstep * 4, w * 4, 4) or h < 1):
        return None
    header = ncnn.Mat(owner)  # shares data and reference count
    header.h = h
    return header


class ZeroCopyRunner:
    """``NcnnModule`` with the past borrowed: same ``run`` contract, validation and outputs.

    ``borrowed`` lists, for the last call, the input names handed to ncnn without a copy."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.name = module.name
        self.inputs = module.inputs
        self.outputs = module.outputs
        self.net = module.net
        self.vulkan = bool(module.options.use_vulkan)  # an upload copies: borrow only on the CPU
        self.borrowed: list[str] = []

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        if len(arrays) != len(self.inputs):
            raise ValueError(f"module {self.name}: expected {len(self.inputs)} inputs, got {len(arrays)}")
        borrow = None if self.vulkan else ncnn_view
        outs, self.borrowed = self.module.run_with(arrays, borrow=borrow)
        return outs


def zero_copy(runner: Any) -> Any:
    """``runner`` wrapped in :class:`ZeroCopyRunner` when it is a plain ``NcnnModule``; any
    other runner (torch, recorders, comparers) is returned as it is."""
    from ncnnport.runtime.session import NcnnModule

    return ZeroCopyRunner(runner) if type(runner) is NcnnModule else runner
