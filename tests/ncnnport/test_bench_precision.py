"""``bench --precision``: the graphs open under the named precision, every row says which, a
reduced precision is judged once against the fp32 graphs by the policy, and the speed table
leaves torch's thread count as it found it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ncnnport.drivers import bench, torch_ratio
from ncnnport.parity.policy import Policy
from ncnnport.runtime import precision

X = np.linspace(-1, 1, 64, dtype=np.float32)


class Port:
    """A port whose output drifts by ``err`` relative when its graphs store fp16."""

    err = 1e-4

    def __init__(self) -> None:
        self.opened: list = []

    def bench_stages(self) -> dict[str, list[str]]:
        return {"s": ["8"]}

    def bench_call(self, loaded, modules, stage, size):
        half = modules["options"].fp16_storage
        return lambda: [X * (1 + self.err) if half else X.copy()]

    def torch_bench_call(self, loaded, stage, size):
        return lambda: [X.copy()]

    def bench_bytes(self, loaded, stage, size, precision_name="fp32"):
        self.opened.append(("bytes", precision_name))
        return {"weights": 1 << 20}


def _prep(port: Port, tmp_path: Path, min_cosine: float = 0.99) -> SimpleNamespace:
    path = tmp_path / "policy.json"
    path.write_text('{"version": 1, "precisions": {"fp16": {"default": {"min_cosine": %s, "max_abs_rel": 1e-3}}}}'
                    % min_cosine)
    return SimpleNamespace(port=port, loaded=None, target=SimpleNamespace(model="toy"), policy=Policy.load(path))


@pytest.fixture
def opened(monkeypatch):
    """The options every ``open_ncnn_modules`` call got (the fake modules carry them)."""
    seen: list = []

    def fake_open(package, options):
        seen.append((package, options))
        return {"options": options}
    monkeypatch.setattr("ncnnport.runtime.lazy_modules.open_ncnn_modules", fake_open)
    return seen


def test_backend_options_carry_exactly_the_precision_flags() -> None:
    got = bench.backend_options("cpu", 3, "fp16-packed")
    assert got == precision.get("fp16-packed").options(bench.backend_options("cpu", 3))
    assert got.num_threads == 3 and got.fp16_storage and got.fp16_packed
    assert bench.backend_options("vulkan", 1, "bf16").use_vulkan
    with pytest.raises(ValueError, match="--precision 'half'"):
        bench.backend_options("cpu", 1, "half")


def test_run_bench_opens_the_precision_and_judges_it_against_fp32(opened, tmp_path, capsys) -> None:
    prep = _prep(Port(), tmp_path)
    rows = bench.run_bench(prep, Path("fp16w"), ["s"], ["cpu"], None, 1, 1, 3,
                           precision="fp16-storage", reference_package=Path("fp32"))
    (row,) = rows
    assert row["precision"] == "fp16-storage" and row["within_budget"] is True
    timed, reference = opened
    assert timed == (Path("fp16w"), precision.get("fp16-storage").options(bench.backend_options("cpu", 1)))
    assert reference[0] == Path("fp32") and not reference[1].fp16_storage
    out = capsys.readouterr().out
    assert "s[fp16-storage]@8 vs fp32 graphs" in out and "within" in out


def test_a_deviation_outside_the_policy_budget_is_said(opened, tmp_path, capsys) -> None:
    prep = _prep(Port(), tmp_path, min_cosine=1.0)  # no fp16 deviation passes a cosine of exactly 1
    Port.err = 0.5
    try:
        (row,) = bench.run_bench(prep, Path("p"), ["s"], ["cpu"], None, 1, 1, 3, precision="fp16-storage")
    finally:
        Port.err = 1e-4
    assert row["within_budget"] is False and "OUTSIDE" in capsys.readouterr().out


def test_fp32_bench_opens_fp32_once_and_prints_no_fidelity(opened, tmp_path, capsys) -> None:
    (row,) = bench.run_bench(_prep(Port(), tmp_path), Path("p"), ["s"], ["cpu"], None, 1, 1, 3)
    assert row["precision"] == "fp32" and "within_budget" not in row
    assert len(opened) == 1 and not opened[0][1].fp16_storage
    assert "vs fp32 graphs" not in capsys.readouterr().out


def test_torch_threads_is_restored_after_the_speed_table(opened, tmp_path, monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch_ratio, "read_bandwidth", lambda *_size: {"array_mb": 1.0, "numpy_sum_gbps": 10.0,
                                                                 "read_gbps": 10.0, "copy_gbps": 5.0})
    port = Port()
    before = torch.get_num_threads()
    threads = 1 if before != 1 else 2
    rows = torch_ratio.torch_ratio_table(_prep(port, tmp_path), Path("p"), ["s"], None, threads, 2,
                                         precision="fp16-storage")
    assert torch.get_num_threads() == before
    assert rows[0]["precision"] == "fp16-storage" and rows[0]["within_budget"] is True
    assert ("bytes", "fp16-storage") in port.opened   # the bound counts the precision's bytes


def test_torch_threads_restores_on_error() -> None:
    import torch

    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="boom"):
        with torch_ratio.torch_threads(1 if before != 1 else 2):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def test_inner_product_weight_width_follows_fp16_bf16_storage_and_int8_weights() -> None:
    """Bytes per matrix weight as ncnn keeps them on x86: fp16 storage converts InnerProduct weights
    to fp16, bf16 storage InnerProduct and Gemm weights to bf16 (at 4 bytes a bf16 run would read as
    faster than memory allows), int8-weights 1; a pnnx fp16-weights package is widened to fp32."""
    widths = {n: precision.get(n).inner_product_weight_bytes for n in precision.NAMES}
    assert widths == {"fp32": 4, "fp16-storage": 2, "fp16-packed": 2, "fp16-arithmetic": 2, "bf16": 2,
                      "fp16-weights": 4, "int8-weights": 1}
