"""The preallocated KV cache: in-place writes, views of the committed past, and clear errors that
name the owner for every inconsistent use (shape, dtype, overflow, double write, short commit)."""

import numpy as np
import pytest

from ncnnport.runtime.preallocated_cache import CacheError, PreallocatedKVCache


def rows(n, heads=2, head_dim=3, start=0.0):
    k = (start + np.arange(heads * n * head_dim, dtype=np.float32)).reshape(1, heads, n, head_dim)
    return k, -k


def test_prefill_then_decode_views_are_the_written_rows():
    cache = PreallocatedKVCache(2, 2, 3, capacity=6, owner="dec")
    pk, pv = rows(4)
    for layer in range(2):
        cache.write(layer, pk + layer, pv - layer)
    cache.commit(4)
    k, v = cache.past(1)
    assert k.shape == v.shape == (1, 2, 4, 3)
    np.testing.assert_array_equal(k, pk + 1)
    np.testing.assert_array_equal(v, pv - 1)
    # a decode step: each layer reads the 4 committed rows, then writes its new one
    nk, nv = rows(1, start=100.0)
    for layer in range(2):
        before = cache.past(layer)[0].copy()
        cache.write(layer, nk, nv)
        np.testing.assert_array_equal(cache.past(layer)[0], before)   # pending rows are not visible yet
    cache.commit(1)
    k, v = cache.past(0)
    assert cache.length == 5 and k.shape[2] == 5
    np.testing.assert_array_equal(k[:, :, 4:], nk)
    np.testing.assert_array_equal(v[:, :, :4], pv)


def test_past_is_a_view_of_the_buffer_with_per_head_stride():
    cache = PreallocatedKVCache(1, 2, 3, capacity=8)
    cache.write(0, *rows(2))
    cache.commit(2)
    k, _ = cache.past(0)
    assert not k.flags["OWNDATA"]
    assert k.strides[1:] == (8 * 3 * 4, 3 * 4, 4)   # heads are `capacity` rows apart
    assert cache.nbytes() == 2 * 2 * 8 * 3 * 4 and cache.used_bytes() == 2 * 2 * 2 * 3 * 4


def test_discard_keeps_the_position_for_repeated_steps():
    cache = PreallocatedKVCache(1, 2, 3, capacity=3)
    cache.write(0, *rows(2))
    cache.commit(2)
    for _ in range(5):   # a benchmark repeating position 2 never overflows
        cache.write(0, *rows(1, start=7.0))
        cache.discard()
    assert cache.length == 2
    with pytest.raises(CacheError, match=r"rows \[2, 3\) of layer 0 requested, 2 written"):
        cache.rows(0, 2, 3)


@pytest.mark.parametrize("k,v,match", [
    (np.zeros((1, 3, 1, 3), np.float32), np.zeros((1, 3, 1, 3), np.float32), r"K has shape \(1, 3, 1, 3\), expected \[1, 2, n, 3\]"),
    (np.zeros((2, 1, 3), np.float32), np.zeros((2, 1, 3), np.float32), "K has shape"),
    (np.zeros((1, 2, 1, 3), np.float64), np.zeros((1, 2, 1, 3), np.float64), "dtype float64"),
    (np.zeros((1, 2, 1, 3), np.float32), np.zeros((1, 2, 2, 3), np.float32), "K .* and V .* differ"),
    (np.zeros((1, 2, 0, 3), np.float32), np.zeros((1, 2, 0, 3), np.float32), "wrote no rows"),
    (np.full((1, 2, 1, 3), np.nan, np.float32), np.zeros((1, 2, 1, 3), np.float32), "non-finite"),
])
def test_bad_writes_name_the_owner_and_layer_and_change_nothing(k, v, match):
    cache = PreallocatedKVCache(2, 2, 3, capacity=4, owner="qwen3 decoder")
    with pytest.raises(CacheError, match=match) as err:
        cache.write(1, k, v)
    assert str(err.value).startswith("qwen3 decoder: layer 1 ")
    cache.write(1, *rows(1))   # nothing pending from the failed write
    assert cache.length == 0


def test_overflow_is_refused_with_the_numbers():
    cache = PreallocatedKVCache(1, 2, 3, capacity=5, owner="dec")
    cache.write(0, *rows(4))
    cache.commit(4)
    with pytest.raises(CacheError, match=r"dec: KV cache overflow at layer 0: 2 new row\(s\) at length 4 "
                                         r"exceed the capacity of 5 positions"):
        cache.write(0, *rows(2))
    cache.write(0, *rows(1))
    cache.commit(1)
    with pytest.raises(CacheError, match="overflow"):
        cache.write(0, *rows(1))


def test_double_write_short_commit_and_bad_layer_are_errors():
    cache = PreallocatedKVCache(3, 2, 3, capacity=4, owner="dec")
    cache.write(0, *rows(1))
    with pytest.raises(CacheError, match="dec: layer 0 already wrote 1 row"):
        cache.write(0, *rows(1))
    cache.write(1, *rows(1))
    with pytest.raises(CacheError, match=r"dec: commit of 1 row\(s\) at length 0, but rows written were layer 2: 0"):
        cache.commit(1)
    assert cache.length == 0
    cache.write(2, *rows(2))
    with pytest.raises(CacheError, match="layer 2: 2"):
        cache.commit(1)
    with pytest.raises(CacheError, match=r"dec: layer 3 out of range \(cache has 3 layers\)"):
        cache.past(3)
    with pytest.raises(CacheError, match="rows \\[0, 3\\) of layer 0 requested, 1 written"):
        cache.rows(0, 0, 3)


@pytest.mark.parametrize("kw", [dict(layers=0), dict(heads=-1), dict(head_dim=2.5), dict(capacity=0)])
def test_bad_dimensions_are_refused(kw):
    args = dict(layers=1, heads=2, head_dim=4, capacity=3) | kw
    with pytest.raises(CacheError, match="dec: KV cache .* must be a positive integer"):
        PreallocatedKVCache(args["layers"], args["heads"], args["head_dim"], args["capacity"], owner="dec")


def test_reset_starts_over():
    cache = PreallocatedKVCache(1, 2, 3, capacity=2)
    cache.write(0, *rows(2))
    cache.commit(2)
    cache.reset()
    assert cache.length == 0 and cache.past(0)[0].shape == (1, 2, 0, 3)
    cache.write(0, *rows(2))
    cache.commit(2)


def test_values_may_be_narrower_than_keys():
    """Youtu-VL's MLA caches a wide latent (K side) and a narrow rope key (V side) per position:
    ``value_dim`` sizes V on its own, shapes are checked per side, and both views stay borrowable."""
    from ncnnport.runtime.zero_copy import ncnn_view

    cache = PreallocatedKVCache(1, 1, 8, capacity=5, owner="mla", value_dim=4)
    k = np.arange(24, dtype=np.float32).reshape(1, 1, 3, 8)
    v = -np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    cache.write(0, k, v)
    cache.commit(3)
    pk, pv = cache.past(0)
    np.testing.assert_array_equal(pk, k)
    np.testing.assert_array_equal(pv, v)
    assert ncnn_view(pk) is not None and ncnn_view(pv) is not None
    assert cache.used_bytes() == 3 * (8 + 4) * 4
    with pytest.raises(CacheError, match=r"mla: layer 0 V has shape \(1, 1, 1, 8\), expected \[1, 1, n, 4\]"):
        cache.write(0, k[:, :, :1], k[:, :, :1])
    with pytest.raises(CacheError, match="differ in row count"):
        cache.write(0, k[:, :, :1], v[:, :, :2])


def test_fp16_rows_hold_the_values_rounded_to_nearest_even():
    """fp16 rows keep fp16's numbers (the C++ loop's 2-byte cache): round to nearest even, ties
    included, and an fp32 cache keeps every bit."""
    rng = np.random.default_rng(3)
    k = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    # a tie between two fp16 neighbours of 1.0 (spacing 2^-10): it rounds to the even one, 1.0
    k[0, 0, 0, 0] = np.float32(1.0 + 2.0 ** -11)
    v = (k * 3).astype(np.float32)
    half = PreallocatedKVCache(1, 2, 4, capacity=4, fp16_rows=True)
    full = PreallocatedKVCache(1, 2, 4, capacity=4)
    for cache in (half, full):
        cache.write(0, k, v)
        cache.commit(3)
    hk, hv = half.past(0)
    assert hk.dtype == np.float32 and half.row_format == "fp16" and full.row_format == "fp32"
    np.testing.assert_array_equal(hk, k.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(hv, v.astype(np.float16).astype(np.float32))
    assert hk[0, 0, 0, 0] == 1.0 and not np.array_equal(hk, k)
    np.testing.assert_array_equal(full.past(0)[0], k)


def test_fp16_rows_refuse_values_past_fp16_range():
    cache = PreallocatedKVCache(1, 1, 2, capacity=2, owner="dec", fp16_rows=True)
    k = np.array([[[[1.0, 70000.0]]]], np.float32)
    with pytest.raises(CacheError, match=r"dec: layer 0 K/V at position 0 exceed fp16's range \(\|x\| > 65504 in 1"):
        cache.write(0, k, np.zeros_like(k))
    assert cache.length == 0
    cache.write(0, np.full_like(k, 65504.0), np.zeros_like(k))  # the largest fp16 is kept
