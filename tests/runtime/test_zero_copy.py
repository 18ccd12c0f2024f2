"""Zero-copy graph inputs: views of ncnn-owned cache buffers reach ncnn without a copy, give the
same numbers as the copying runner, and an in-place consumer neither crashes nor writes the cache.

The graphs are hand-written params (no weights, no pnnx): fast enough for every CI run."""

import numpy as np
import pytest

import ncnn

from ncnnport.runtime.preallocated_cache import PreallocatedKVCache
from ncnnport.runtime.session import NcnnModule
from ncnnport.runtime.zero_copy import ZeroCopyRunner, ncnn_view, zero_copy

INPLACE = """7767517
2 2
Input x 0 1 x
BinaryOp add 1 1 x y 0=0 1=1 2=1.000000e+00
"""
MATMUL = """7767517
3 3
Input q 0 1 q
Input k 0 1 k
MatMul mm 2 1 q k s 0=1
"""


def graph(tmp_path, name, text, inputs, outputs, options=None):
    (tmp_path / f"{name}.param").write_text(text)
    (tmp_path / f"{name}.bin").write_bytes(b"")
    spec = {"name": name,
            "inputs": [{"name": n, "shape": list(s), "dtype": "float32"} for n, s in inputs],
            "outputs": [{"name": n, "shape": list(s), "dtype": "float32"} for n, s in outputs]}
    extra = {} if options is None else {"options": options}
    return NcnnModule(tmp_path / f"{name}.param", tmp_path / f"{name}.bin", spec, **extra)


def filled(length=5, capacity=9, heads=2, head_dim=4, seed=0):
    cache = PreallocatedKVCache(1, heads, head_dim, capacity, owner="test")
    rng = np.random.default_rng(seed)
    cache.write(0, *(rng.standard_normal((1, heads, length, head_dim)).astype(np.float32) for _ in range(2)))
    cache.commit(length)
    return cache


def test_binding_facts_batch_index_copies_plain_mat_borrows():
    """Why ZeroCopyRunner exists: NcnnModule's ``Mat(a, batch_index=0)`` copies the input."""
    a = np.zeros((1, 3, 4), np.float32)
    copied = ncnn.Mat(a, batch_index=0)
    a[0, 0, 0] = 5
    assert np.asarray(copied)[0, 0] == 0
    b = np.zeros((3, 4), np.float32)
    borrowed = ncnn.Mat(b)
    b[0, 0] = 7
    assert np.asarray(borrowed)[0, 0] == 7


def test_cache_view_becomes_a_header_over_the_same_memory():
    cache = filled()
    k, _ = cache.past(0)
    mat = ncnn_view(k)
    assert mat is not None and (mat.c, mat.h, mat.w) == (2, 5, 4)
    seen = np.asarray(mat)
    assert np.shares_memory(seen, k) and np.array_equal(seen, k[0])


@pytest.mark.parametrize("make", [
    lambda k: np.ascontiguousarray(k),            # numpy-owned memory: would have no refcount
    lambda k: k[:, :, 1:],                        # does not start at the owner's first row
    lambda k: k[:, :1],                           # a subset of the heads
    lambda k: k[:, :, :, :2],                     # partial rows
    lambda k: k.astype(np.float64),
    lambda k: k[0],                               # no batch axis
])
def test_anything_but_a_whole_row_view_from_the_start_is_not_borrowed(make):
    k, _ = filled().past(0)
    assert ncnn_view(make(k)) is None


def test_inplace_consumer_does_not_crash_or_write_the_cache(tmp_path):
    """ncnn runs an in-place layer on its input after checking the input's refcount: a Mat over
    numpy memory has none (segfault); the header of an ncnn-owned buffer shares the owner's, so
    ncnn copies first and the cache stays intact."""
    mod = graph(tmp_path, "inplace", INPLACE, [("x", (1, 2, "n", 4))], [("y", (1, 2, "n", 4))])
    cache = filled()
    k, _ = cache.past(0)
    before = k.copy()
    runner = ZeroCopyRunner(mod)
    (y,) = runner.run([k])
    assert runner.borrowed == ["x"]
    np.testing.assert_array_equal(y, before + 1)
    np.testing.assert_array_equal(k, before)


def test_zero_copy_runner_equals_the_copying_runner(tmp_path):
    mod = graph(tmp_path, "mm", MATMUL, [("q", (1, 2, 3, 4)), ("k", (1, 2, "p", 4))], [("s", (1, 2, 3, "p"))])
    cache = filled(length=7)
    k, _ = cache.past(0)
    q = np.random.default_rng(1).standard_normal((1, 2, 3, 4)).astype(np.float32)
    runner = zero_copy(mod)
    assert isinstance(runner, ZeroCopyRunner)
    (got,) = runner.run([q, k])
    (ref,) = mod.run([q, np.ascontiguousarray(k)])
    assert runner.borrowed == ["k"]
    assert got.shape == (1, 2, 3, 7)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_allclose(got, q @ np.swapaxes(k, -1, -2), rtol=1e-5, atol=1e-5)
    # the cache grows between calls: the next view covers the new row without reallocating
    cache.write(0, *(np.ones((1, 2, 1, 4), np.float32),) * 2)
    cache.commit(1)
    (got8,) = runner.run([q, cache.past(0)[0]])
    assert got8.shape == (1, 2, 3, 8)
    np.testing.assert_allclose(got8[..., 7], q.sum(-1), rtol=1e-5)


@pytest.mark.gpu
def test_nothing_is_borrowed_on_vulkan_where_the_upload_copies(tmp_path):
    """ncnn's Vulkan upload copies ``cstep * c`` elements into a staging buffer sized from the dims:
    a cache view (the owner's full-capacity cstep, few rows) overflowed it (heap corruption, youtu-vl
    verify --backend vulkan on lavapipe). On Vulkan the runner copies like NcnnModule."""
    from ncnnport.drivers.bench import vulkan_available
    from ncnnport.runtime.options import RuntimeOptions

    if not vulkan_available():
        pytest.skip("no Vulkan device on this machine")
    mod = graph(tmp_path, "mm", MATMUL, [("q", (1, 4, 3, 64)), ("k", (1, 4, "p", 64))], [("s", (1, 4, 3, "p"))],
                options=RuntimeOptions(use_vulkan=True))
    cache = filled(length=2, capacity=2048, heads=4, head_dim=64)
    q = np.random.default_rng(2).standard_normal((1, 4, 3, 64)).astype(np.float32)
    runner = zero_copy(mod)
    for _ in range(20):
        (got,) = runner.run([q, cache.past(0)[0]])
        assert runner.borrowed == []
    k = cache.past(0)[0]
    np.testing.assert_allclose(got, q @ np.swapaxes(k, -1, -2), rtol=1e-4, atol=1e-4)


def test_zero_copy_runner_keeps_the_host_checks(tmp_path):
    mod = graph(tmp_path, "mm", MATMUL, [("q", (1, 2, 3, 4)), ("k", (1, 2, "p", 4))], [("s", (1, 2, 3, "p"))])
    runner = ZeroCopyRunner(mod)
    k, _ = filled().past(0)
    with pytest.raises(ValueError, match="module mm, input q: got rank 3"):
        runner.run([np.zeros((1, 3, 4), np.float32), k])
    with pytest.raises(ValueError, match="expected 2 inputs, got 1"):
        runner.run([k])


def test_only_plain_ncnn_modules_are_wrapped(tmp_path):
    class Other:
        name, inputs, outputs = "o", [], []
    other = Other()
    assert zero_copy(other) is other
