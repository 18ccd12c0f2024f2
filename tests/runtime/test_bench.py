"""The stability checks can fail: doubles that leak, slow down or share state are caught."""

import time

import numpy as np

from ncnnport.runtime.bench import interleave, measure, robust_slope


class GrowingCacheDouble:
    """A 'session' that keeps every input it saw (a per-op cache never cleared) and scans it."""

    def __init__(self) -> None:
        self.kept: list = []

    def __call__(self):
        import mmap
        page = mmap.mmap(-1, 1 << 20)   # fresh pages every call: malloc cannot recycle them
        page.write(b"\x01" * (1 << 20))
        self.kept.append(page)  # 1 MiB per call
        t = time.perf_counter()
        while time.perf_counter() - t < 2e-5 * len(self.kept):  # work grows with the cache
            pass
        return [np.zeros(4, np.float32)]


class SharedLengthDouble:
    """The MNN bug: an encoder reading the LLM's KV length from shared metadata."""

    def __init__(self) -> None:
        self.shared = {"kv_len": 0}

    def encoder(self):
        return [np.full(4, self.shared["kv_len"] % 7, np.float32)]

    def decode_step(self):
        self.shared["kv_len"] += 1
        return [np.ones(4, np.float32)]


def steady():
    t = time.perf_counter()
    while time.perf_counter() - t < 2e-4:
        pass
    return [np.arange(4, dtype=np.float32)]


def test_steady_call_passes_every_check():
    r = measure("steady", steady, warmup=2, runs=60)
    assert r.identical_outputs and r.drift_within(2.0) and abs(r.rss_growth_mb) < 2


def test_growing_cache_is_flagged_for_drift_and_memory():
    r = measure("leaky", GrowingCacheDouble(), warmup=2, runs=60)
    assert not r.drift_within(2.0), r.drift_pct_per_100
    assert r.rss_growth_mb > 30


def test_shared_state_between_submodels_breaks_identity():
    d = SharedLengthDouble()
    res = interleave({"encoder": d.encoder, "decode": d.decode_step}, rounds=20, warmup=1)
    assert not res["encoder"].identical_outputs
    assert res["decode"].identical_outputs


def test_nondeterministic_output_is_flagged():
    rng = np.random.default_rng(0)
    r = measure("noisy", lambda: [rng.standard_normal(3)], warmup=1, runs=5)
    assert not r.identical_outputs and r.mismatched_calls


def test_robust_slope_ignores_one_spike_but_sees_a_trend():
    flat = [1.0] * 50
    flat[20] = 10.0
    assert abs(robust_slope(flat)[0]) < 1e-9
    trend = [1.0 + 0.01 * i for i in range(50)]
    slope, ci = robust_slope(trend)
    assert abs(slope - 0.01) < 1e-9 and slope - ci > 0
