"""A host KV cache allocated once per generation, written in place, read by ncnn without a copy.

Why: a decode graph that takes the past K/V as inputs and returns them grown (``torch.cat`` ->
ncnn Concat) copies the whole cache every step, and the host then copies the grown cache out of
the returned Mat and back in: per-token cost grows with the cache length. Here decode graphs
return only the new token's K/V rows; this class writes them at the current length of buffers
sized once for the whole generation, and graphs read the past as views of those buffers.

Layout, per layer and per K/V: ``[heads, capacity, head_dim]`` (V: ``value_dim`` when it
differs, e.g. Youtu-VL's MLA caches a 512-wide latent and a 64-wide rope key per position). The first ``length`` rows of
every head (a view ``[1, heads, length, head_dim]``) are contiguous per head and ``capacity *
head_dim`` apart between heads: exactly an ncnn Mat with ``cstep = capacity * head_dim``, so
:func:`ncnnport.runtime.zero_copy.ncnn_view` hands them to ncnn as a Mat header over the same
memory. The buffers are allocated BY ncnn (``ncnn.Mat``) and exposed to numpy through the buffer
protocol: an ncnn Mat over numpy memory has no reference count, and ncnn dereferences it when
a graph input feeds an in-place layer (segfault), while a header of an ncnn-owned Mat shares
its reference count (ncnn then copies before any in-place write, so the cache is never
modified by a graph).

Protocol per step: :meth:`past` for every layer's graph inputs, :meth:`write` each layer's new
rows (after that layer ran: the view it read stops at ``length``), then :meth:`commit` (every
layer must have written the same number of rows) or :meth:`discard` (benchmarks that repeat one
position). Every error names the cache's owner, the layer and the numbers involved.
"""

from __future__ import annotations

import numpy as np


class CacheError(ValueError):
    """A write or commit that would leave the cache inconsistent; nothing was changed."""


def _allocate(heads: int, capacity: int, head_dim: int) -> tuple[object | None, np.ndarray]:
    """A ``[heads, capacity, head_dim]`` float32 buffer owned by ncnn (numpy view + owner)."""
    try:
        import ncnn
    except ImportError:  # pragma: no cover - ncnn is a dependency; numpy still works (copies)
        return None, np.empty((heads, capacity, head_dim), np.float32)
    owner = ncnn.Mat(head_dim, capacity, heads)
    if owner.empty():
        raise MemoryError(f"ncnn could not allocate a [{heads}, {capacity}, {head_dim}] float32 cache buffer")
    view = np.asarray(owner)
    if view.shape != (heads, capacity, head_dim) or view.dtype != np.float32:
        raise RuntimeError(f"ncnn Mat exposes {view.shape} {view.dtype}, expected "
                           f"({heads}, {capacity}, {head_dim}) float32")
    return owner, view


class PreallocatedKVCache:
    """K and V of ``layers`` layers, ``heads`` x ``head_dim`` per position, up to ``capacity``."""

    def __init__(self, layers: int, heads: int, head_dim: int, capacity: int, *, owner: str = "decoder",
                 value_dim: int | None = None, fp16_rows: bool = False) -> None:
        value_dim = head_dim if value_dim is None else value_dim
        for name, value in (("layers", layers), ("heads", heads), ("head_dim", head_dim), ("capacity", capacity),
                            ("value_dim", value_dim)):
            if int(value) != value or value < 1:
                raise CacheError(f"{owner}: KV cache {name} must be a positive integer, got {value!r}")
        self.layers, self.heads, self.head_dim, self.capacity = int(layers), int(heads), int(head_dim), int(capacity)
        self.value_dim = int(value_dim)
        self.owner = owner
        # rows rounded to fp16 on write (round to nearest even) and kept in float32: the numbers
        # of the C++ loop's 2-byte cache (runtime/precision.py ``fp16_kv_cache``)
        self.fp16_rows = bool(fp16_rows)
        self._owners: list[object | None] = []
        self._k: list[np.ndarray] = []
        self._v: list[np.ndarray] = []
        for _ in range(self.layers):
            for store, width in ((self._k, self.head_dim), (self._v, self.value_dim)):
                mat, view = _allocate(self.heads, self.capacity, width)
                self._owners.append(mat)
                store.append(view)
        self.length = 0
        self._pending: dict[int, int] = {}

    # --- reading --------------------------------------------------------------------------
    def past(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Views ``[1, heads, length, head_dim]`` of layer ``layer``'s committed K and V.

        They alias the cache: valid until the rows they cover are rewritten (never, within a
        generation), and not to be written through."""
        self._check_layer(layer)
        n = self.length
        return self._k[layer][None, :, :n], self._v[layer][None, :, :n]

    def rows(self, layer: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of K and V rows ``[start, stop)`` of ``layer``, ``[1, heads, stop-start, head_dim]``
        (pending rows included: tests and traces read what a step wrote)."""
        self._check_layer(layer)
        end = self.length + self._pending.get(layer, 0)
        if not 0 <= start <= stop <= end:
            raise CacheError(f"{self.owner}: rows [{start}, {stop}) of layer {layer} requested, "
                             f"{end} written")
        return self._k[layer][None, :, start:stop].copy(), self._v[layer][None, :, start:stop].copy()

    # --- writing --------------------------------------------------------------------------
    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> int:
        """Write layer ``layer``'s new rows (``[1, heads, n, head_dim]`` each) at ``length``.

        Returns n. At most one write per layer between commits; K and V must agree."""
        self._check_layer(layer)
        if layer in self._pending:
            raise CacheError(f"{self.owner}: layer {layer} already wrote {self._pending[layer]} row(s) at "
                             f"length {self.length}; commit() or discard() first")
        for name, t, width in (("K", k, self.head_dim), ("V", v, self.value_dim)):
            want = (1, self.heads, None, width)
            if not isinstance(t, np.ndarray) or t.ndim != 4 or any(
                    w is not None and w != s for w, s in zip(want, t.shape)):
                shape = getattr(t, "shape", type(t).__name__)
                raise CacheError(f"{self.owner}: layer {layer} {name} has shape {shape}, expected "
                                 f"[1, {self.heads}, n, {width}]")
            if t.dtype != np.float32:
                raise CacheError(f"{self.owner}: layer {layer} {name} has dtype {t.dtype}, expected float32")
        if k.shape[2] != v.shape[2]:
            raise CacheError(f"{self.owner}: layer {layer} K {k.shape} and V {v.shape} differ in row count")
        n = k.shape[2]
        if n < 1:
            raise CacheError(f"{self.owner}: layer {layer} wrote no rows")
        if self.length + n > self.capacity:
            raise CacheError(f"{self.owner}: KV cache overflow at layer {layer}: {n} new row(s) at length "
                             f"{self.length} exceed the capacity of {self.capacity} positions")
        if not (np.isfinite(k).all() and np.isfinite(v).all()):
            raise CacheError(f"{self.owner}: layer {layer} wrote non-finite K/V at position {self.length}")
        if self.fp16_rows:
            with np.errstate(over="ignore"):
                k, v = k.astype(np.float16), v.astype(np.float16)
            if not (np.isfinite(k).all() and np.isfinite(v).all()):
                count = int(np.isinf(k).sum() + np.isinf(v).sum())
                raise CacheError(f"{self.owner}: layer {layer} K/V at position {self.length} exceed fp16's range "
                                 f"(|x| > 65504 in {count} value(s)); run with an fp32 cache (--precision fp32)")
        self._k[layer][:, self.length:self.length + n] = k[0]
        self._v[layer][:, self.length:self.length + n] = v[0]
        self._pending[layer] = n
        return n

    def commit(self, added: int) -> None:
        """Every layer must have written exactly ``added`` rows since the last commit."""
        wrong = {i: self._pending.get(i, 0) for i in range(self.layers) if self._pending.get(i, 0) != added}
        if wrong:
            detail = ", ".join(f"layer {i}: {n}" for i, n in list(wrong.items())[:8])
            raise CacheError(f"{self.owner}: commit of {added} row(s) at length {self.length}, but rows "
                             f"written were {detail}")
        self.length += added
        self._pending.clear()

    def discard(self) -> None:
        """Forget writes since the last commit (the rows stay in memory, beyond ``length``)."""
        self._pending.clear()

    def reset(self) -> None:
        self.length = 0
        self._pending.clear()

    # --- bookkeeping ----------------------------------------------------------------------
    def nbytes(self) -> int:
        """Bytes allocated (capacity, not length)."""
        return sum(a.nbytes for a in self._k + self._v)

    def used_bytes(self) -> int:
        return self.layers * self.heads * self.length * (self.head_dim + self.value_dim) * 4

    @property
    def row_format(self) -> str:
        """The numbers the rows hold: "fp16" (rounded on write) or "fp32"."""
        return "fp16" if self.fp16_rows else "fp32"

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.layers:
            raise CacheError(f"{self.owner}: layer {layer} out of range (cache has {self.layers} layers)")

    def __repr__(self) -> str:
        return (f"PreallocatedKVCache({self.owner!r}, layers={self.layers}, heads={self.heads}, "
                f"head_dim={self.head_dim}, value_dim={self.value_dim}, length={self.length}/{self.capacity}, "
                f"rows={self.row_format})")
