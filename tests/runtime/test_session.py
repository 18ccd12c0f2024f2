"""The ncnn runner on a real converted graph: parity at untraced sizes and host-side validation."""

import numpy as np
import pytest

from ncnnport.package.param_file import ParamError
from ncnnport.metrics import compare
from ncnnport.runtime.options import FP32
from ncnnport.runtime.session import NcnnError, NcnnModule, TorchModule

pytestmark = pytest.mark.slow


def open_toy(pkg):
    d = pkg["dir"]
    return NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", pkg["record"])


def test_blobs_carry_spec_names_and_receipt_has_command(toy_package):
    text = (toy_package["dir"] / "toy.ncnn.param").read_text()
    assert "Input" in text and " x " in text and " attn" in text and "in0" not in text
    cmd = toy_package["receipt"]["command"]
    assert "fp16=0" in cmd and any(a.startswith("inputshape2=") for a in cmd)
    assert not any("/" in a for a in cmd[:2])  # receipts carry no machine paths


@pytest.mark.parametrize("seq", [1, 5, 9, 31])
def test_ncnn_matches_torch_at_traced_and_untraced_sizes(toy_package, seq):
    spec = toy_package["spec"]
    ncnn_mod = open_toy(toy_package)
    torch_mod = TorchModule(spec.build(), toy_package["record"])
    inputs = spec.example_inputs({"seq": seq})
    for ref, got in zip(torch_mod.run(inputs), ncnn_mod.run(inputs)):
        assert ref.shape == got.shape
        assert compare(ref, got).max_abs < 1e-5


def test_wrong_rank_dtype_and_inconsistent_axes_fail_on_the_host(toy_package):
    mod = open_toy(toy_package)
    x = np.zeros((1, 4, 16), np.float32)
    mask = np.zeros((1, 4, 4), np.float32)
    with pytest.raises(ValueError, match="module toy, input x: got rank 2"):
        mod.run([x[0], mask])
    with pytest.raises(TypeError, match="module toy, input x: got dtype float64"):
        mod.run([x.astype(np.float64), mask])
    with pytest.raises(ValueError, match="axis 'seq' is 5"):
        mod.run([x, np.zeros((1, 5, 5), np.float32)])


def test_missing_truncated_and_corrupt_files_are_named(toy_package, tmp_path):
    d, rec = toy_package["dir"], toy_package["record"]
    with pytest.raises(FileNotFoundError, match="missing"):
        NcnnModule(tmp_path / "nope.param", d / "toy.ncnn.bin", rec)
    lines = (d / "toy.ncnn.param").read_text().splitlines()
    cut = tmp_path / "cut.param"
    cut.write_text("\n".join(lines[:-2]) + "\n")
    with pytest.raises(ParamError, match="truncated"):
        NcnnModule(cut, d / "toy.ncnn.bin", rec)
    short_bin = tmp_path / "short.bin"
    short_bin.write_bytes((d / "toy.ncnn.bin").read_bytes()[:100])
    with pytest.raises(NcnnError, match="could not load weights"):
        NcnnModule(d / "toy.ncnn.param", short_bin, rec)
    garbage = tmp_path / "garbage.param"
    garbage.write_bytes(b"\x00\xff" * 50)
    with pytest.raises(ParamError):
        NcnnModule(garbage, d / "toy.ncnn.bin", rec)


def test_release_after_call_empties_its_own_pools_and_keeps_the_numbers(toy_package):
    """A spec with ``release_after_call``, opened with ``low_memory``, gets its own ncnn pools,
    emptied after each call (the outputs are copies, so they survive); results equal the default
    module's bit for bit."""
    d, record = toy_package["dir"], toy_package["record"]
    plain = open_toy(toy_package)
    flagged = {**record, "release_after_call": True}
    released = NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", flagged, FP32.with_(low_memory=True))
    default = NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", flagged)  # a hint: low_memory decides
    assert not plain._pools and not default._pools and len(released._pools) == 2
    inputs = toy_package["spec"].example_inputs({"seq": 23})
    first = released.run(inputs)
    for _ in range(3):
        again = released.run(inputs)
        assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert all(np.array_equal(a, b) for a, b in zip(first, plain.run(inputs)))


def test_a_cpu_session_asked_for_huge_pages_runs_the_step_once_loaded(toy_package, monkeypatch):
    from ncnnport.runtime import session

    calls: list[int] = []
    monkeypatch.setattr(session, "back_large_mappings_with_huge_pages", lambda: calls.append(1) or (0, 0, None))
    d, rec = toy_package["dir"], toy_package["record"]
    NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", rec)
    assert calls == []
    opened = NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", rec, FP32.with_(huge_pages=True))
    assert calls == [1] and opened.options.huge_pages


def test_run_each_side_by_side_equals_one_by_one(toy_package):
    """A graph whose spec allows 4 concurrent calls, on 2 threads: loaded for one thread per call,
    2 calls at a time, each call's outputs those of the same call run alone (bit for bit: both
    run on one thread) and in call order. The fifth call would run alone on one thread: it runs
    on the same graph loaded for both threads (``solo``), bit for bit a plain 2-thread module's."""
    from ncnnport.runtime.concurrent_calls import CallSplit

    d, spec = toy_package["dir"], toy_package["spec"]
    record = {**toy_package["record"], "concurrent_calls": 4}
    both = NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", record, FP32.with_(num_threads=2))
    alone = NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", toy_package["record"], FP32)
    two = NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", toy_package["record"], FP32.with_(num_threads=2))
    assert both.split == CallSplit(2, 1) and both.net.opt.num_threads == 1
    calls = [spec.example_inputs({"seq": n}, seed=n) for n in (3, 9, 1, 17, 5)]
    assert both._solo_module is None
    got = both.run_each(calls)
    assert len(got) == len(calls)
    for c, outs, ref in zip(calls, got, [alone] * 4 + [two]):
        for want, have in zip(ref.run(c), outs):
            np.testing.assert_array_equal(want, have)
    solo = both._solo_module
    assert solo is not None and solo.net.opt.num_threads == 2 and solo.split == CallSplit(1, 2)
    assert solo.name == both.name


def test_a_lone_call_runs_on_all_the_threads_and_full_rounds_never_open_the_second_net(toy_package):
    """A batch of one call (an image of one window) runs on the graph loaded for all threads;
    batches that split evenly (or leave 2+ calls) never load that second net."""
    from ncnnport.runtime.concurrent_calls import CallSplit

    d, spec = toy_package["dir"], toy_package["spec"]
    record = {**toy_package["record"], "concurrent_calls": 4}
    opts = FP32.with_(num_threads=4)
    lone_only = NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", record, opts)
    lone_only.run_each([spec.example_inputs({"seq": 5})])
    # only the net of all the threads was loaded: the split one waits for a batch of several
    assert lone_only._net is None and lone_only._solo_module is not None
    mod = NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", record, opts)
    assert mod.split == CallSplit(4, 1) and mod._net is None
    for n in (4, 8, 6, 2):
        mod.run_each([spec.example_inputs({"seq": 3})] * n)
        assert mod._solo_module is None and mod._net is not None, n
    x = spec.example_inputs({"seq": 7}, seed=2)
    (got,) = mod.run_each([x])
    plain = NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", toy_package["record"], opts)
    for want, have in zip(plain.run(x), got):
        np.testing.assert_array_equal(want, have)
    assert mod._solo_module is not None and mod._solo_module.net.opt.num_threads == 4
    first = mod._solo_module
    mod.run_each([x] * 5)  # 4 side by side, the fifth alone: the same second net, not a third
    assert mod._solo_module is first
    # at one thread there is no split, so no second net either
    single = NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", record, FP32)
    single.run_each([x])
    assert single.solo() is single and single._solo_module is None


def test_run_each_runs_calls_at_the_same_time(toy_package, monkeypatch):
    """Two calls must be inside ``run`` together: a barrier for two parties breaks (and the test
    fails) when the calls run one after another."""
    import threading

    d, spec = toy_package["dir"], toy_package["spec"]
    record = {**toy_package["record"], "concurrent_calls": 2}
    mod = NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", record, FP32.with_(num_threads=2))
    barrier = threading.Barrier(2, timeout=30)
    plain = mod.run

    def meeting(arrays):
        barrier.wait()
        return plain(arrays)

    monkeypatch.setattr(mod, "run", meeting)
    assert len(mod.run_each([spec.example_inputs({"seq": 4})] * 4)) == 4


def test_concurrent_calls_stay_serial_where_sharing_is_unsound(toy_package):
    """Pools emptied after every call (low memory) would free one call's blocks under another:
    such a graph keeps all its threads on one call at a time."""
    d = toy_package["dir"]
    record = {**toy_package["record"], "concurrent_calls": 4, "release_after_call": True}
    mod = NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", record, FP32.with_(num_threads=4, low_memory=True))
    assert (mod.split.workers, mod.split.threads_each, mod.net.opt.num_threads) == (1, 4, 4)


@pytest.mark.parametrize("bad", [0, -2, 2.5, "4", True])
def test_a_malformed_concurrent_calls_fails_naming_the_module(toy_package, bad):
    d = toy_package["dir"]
    with pytest.raises(NcnnError, match="module toy: spec concurrent_calls"):
        NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", {**toy_package["record"], "concurrent_calls": bad},
                   FP32.with_(num_threads=2))
