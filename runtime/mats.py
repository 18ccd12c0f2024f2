"""numpy <-> ncnn.Mat conversion with the checks ncnn does not do.

ncnn drops the leading batch axis (``batch_index=0``), silently reinterprets int64/float ids, and
borrows numpy buffers without keeping them alive. These helpers make each of those explicit.
"""

from __future__ import annotations

import numpy as np

import ncnn

MAX_MAT_DIMS = 4  # w, h, d, c


def to_mat(array: np.ndarray, *, what: str) -> tuple["ncnn.Mat", np.ndarray]:
    """Mat over ``array`` (leading batch axis of 1 dropped) and the buffer that must stay alive.

    Returns the contiguous array the Mat borrows: the caller keeps it referenced until the
    extractor is done. ``what`` names the module/blob in errors.
    """
    if array.dtype not in (np.float32, np.int32):
        raise TypeError(f"{what}: dtype {array.dtype} (ncnn reads float32 or int32 bits only; "
                        "int64 ids silently select wrong rows)")
    if array.ndim < 2 or array.shape[0] != 1:
        raise ValueError(f"{what}: shape {array.shape} needs a leading batch axis of 1")
    if array.ndim - 1 > MAX_MAT_DIMS:
        raise ValueError(f"{what}: rank {array.ndim} exceeds ncnn's {MAX_MAT_DIMS} dims + batch")
    buf = np.ascontiguousarray(array)
    return ncnn.Mat(buf, batch_index=0), buf


def from_mat(mat: "ncnn.Mat", rank: int, *, what: str) -> np.ndarray:
    """Copy of ``mat`` as float32 with the batch axis restored to ``rank`` dims.

    ncnn may return extra or fewer unit axes (e.g. ``(1,1,S,V)`` after a Linear); only unit axes
    are added or removed here, anything else is a shape error for the caller to report.
    """
    arr = np.array(mat, dtype=np.float32, copy=True)
    arr = arr.reshape((1,) + arr.shape)
    while arr.ndim > rank and arr.shape[1] == 1:
        arr = arr.reshape(arr.shape[:1] + arr.shape[2:])
    while arr.ndim < rank:
        arr = arr.reshape(arr.shape[:1] + (1,) + arr.shape[1:])
    if arr.ndim != rank:
        raise ValueError(f"{what}: ncnn returned shape {arr.shape[1:]} that cannot be rank {rank}")
    return arr
