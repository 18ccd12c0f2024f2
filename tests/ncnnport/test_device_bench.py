"""``bench --perf --backends ... --torch-device ...``: one row per runtime with parity vs torch cpu."""

from types import SimpleNamespace

import numpy as np
import pytest

from ncnnport.drivers import device_bench

X = np.linspace(-1, 1, 64, dtype=np.float32).reshape(4, 16)


class Port:
    """A port whose ncnn side is off by ``err`` relative and whose torch side takes a device."""

    err = 1e-6
    unmatched = None

    def bench_unmatched(self, stage):
        return self.unmatched

    def torch_bench_call(self, loaded, stage, size, device="cpu"):
        return lambda: [X.copy()]

    def bench_call(self, loaded, modules, stage, size):
        return lambda: [(X * (1 + self.err))[None]]  # a leading batch axis, as ncnn keeps one


class CpuOnlyPort(Port):
    def torch_bench_call(self, loaded, stage, size):
        return lambda: [X.copy()]


def _prep(port):
    return SimpleNamespace(port=port, loaded=None, target=SimpleNamespace(model="toy"))


def _table(monkeypatch, port, backends, devices, vulkan=False):
    monkeypatch.setattr(device_bench, "open_ncnn_modules", lambda package, options: {})
    monkeypatch.setattr(device_bench, "vulkan_available", lambda: vulkan)
    return device_bench.device_table(_prep(port), None, ["s"], None, backends, devices, threads=1,
                                     warmup=1, runs=2, stage_sizes={"s": ["8"]})


def test_rows_per_runtime_with_parity_against_torch_cpu(monkeypatch):
    rows = _table(monkeypatch, Port(), ["cpu", "vulkan"], ["cuda"])
    by = {r["runtime"]: r for r in rows}
    assert list(by) == ["torch eager cpu t1", "torch eager cuda", "ncnn cpu t1", "ncnn vulkan"]
    assert by["torch eager cpu t1"]["note"] == "parity reference" and by["torch eager cpu t1"]["runs"] == 2
    ncnn = by["ncnn cpu t1"]
    assert ncnn["runs"] == 2 and ncnn["first_ms"] is not None
    assert ncnn["rel_vs_torch_cpu"] == pytest.approx(1e-6, rel=0.05) and ncnn["cos_vs_torch_cpu"] > 0.999999
    assert by["ncnn vulkan"]["note"] == "skipped: no Vulkan GPU on this machine"


def test_a_broken_backend_shows_in_its_parity_columns(monkeypatch):
    port = Port()
    port.err = 0.5
    rows = _table(monkeypatch, port, ["cpu"], [])
    assert rows[-1]["rel_vs_torch_cpu"] == pytest.approx(0.5, rel=1e-3)


def test_ncnn_rows_on_other_inputs_print_no_cosine(monkeypatch):
    """A port whose ncnn call runs other inputs (its K/V cache filled another way) gets no parity
    columns on its ncnn rows (the H200 table had printed cosine -0.007 for them)."""
    port = Port()
    port.err, port.unmatched = 0.5, "the caches are filled two ways"
    by = {r["runtime"]: r for r in _table(monkeypatch, port, ["cpu"], [])}
    ncnn = by["ncnn cpu t1"]
    assert ncnn["cos_vs_torch_cpu"] is None and ncnn["rel_vs_torch_cpu"] is None
    assert ncnn["note"] == "not compared: the caches are filled two ways" and ncnn["runs"] == 2


def test_llm_decode_stages_declare_their_inputs_unmatched():
    from ncnnport.registry import get_port

    for model, stages in {"qwen3-asr": ("decode", "token"), "youtu-vl": ("decode", "layers")}.items():
        port = get_port(model)
        assert all(port.bench_unmatched(s) for s in stages), model
    assert get_port("youtu-vl").bench_unmatched("vision_encoder") is None


def test_torch_device_on_a_port_without_one_is_one_line(monkeypatch):
    with pytest.raises(ValueError, match="model toy: its torch_bench_call takes no device"):
        _table(monkeypatch, CpuOnlyPort(), ["cpu"], ["cuda"])


def test_torch_threads_are_restored(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.setattr(device_bench, "open_ncnn_modules", lambda package, options: {})
    device_bench.device_table(_prep(Port()), None, ["s"], None, ["cpu"], [], threads=before + 1, warmup=1,
                              runs=1, stage_sizes={"s": ["8"]})
    assert torch.get_num_threads() == before


def test_cli_takes_the_device_options():
    from ncnnport.cli import build_parser

    args = build_parser().parse_args(["bench", "seedvr2", "--perf", "--backends", "cpu,vulkan",
                                      "--torch-device", "cuda"])
    assert args.torch_device == "cuda" and args.backends == "cpu,vulkan" and args.perf
