"""The PyTorch reference is bit-identical under any ambient thread count, and nothing leaks."""

import pytest
import torch

from ncnnport.parity.reproducible import deterministic_reference


def reference_computation() -> torch.Tensor:
    """A reduction large enough that torch splits it over threads (the order of partial sums
    then depends on the thread count)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1 << 22, generator=g)
    w = torch.randn(256, 512, generator=g)
    h = torch.randn(64, 512, generator=g)
    return torch.cat([x.sum().reshape(1), (x.reshape(-1, 1024) ** 2).mean(0), (h @ w.T).reshape(-1)])


def under(ambient: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The computation with ambient threads, then inside the context from that same ambient."""
    saved = torch.get_num_threads()
    torch.set_num_threads(ambient)
    try:
        plain = reference_computation()
        with deterministic_reference() as record:
            assert record == {"torch_threads": 1, "deterministic_algorithms": True}
            pinned = reference_computation()
        assert torch.get_num_threads() == ambient  # restored, not left at 1
    finally:
        torch.set_num_threads(saved)
    return plain, pinned


def test_reference_is_bit_identical_under_different_ambient_threads():
    plain1, pinned1 = under(1)
    plain4, pinned4 = under(4)
    assert torch.equal(pinned1, pinned4)
    # the ambient setting does change the bits outside the context (else this test proves nothing)
    assert not torch.equal(plain1, plain4)


def test_settings_are_restored_after_an_error():
    saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    with pytest.raises(RuntimeError, match="boom"):
        with deterministic_reference(threads=1):
            assert torch.are_deterministic_algorithms_enabled()
            raise RuntimeError("boom")
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == saved


class _Modules:
    """LazyModules stand-in: any name, releasable."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __getitem__(self, name):
        return name

    def release(self, name) -> None:
        pass


def test_run_parity_pins_reference_threads_and_restores_them(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from ncnnport.drivers import parity as run
    from ncnnport.parity.policy import Policy

    seen = []

    def fake_local(spec, torch_runner, ncnn_runner, default, **kw):
        seen.append(("local", torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()))
        return [{"passed": True}]

    def e2e_parity(ctx):
        seen.append(("e2e", torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()))
        yield {"passed": True}

    monkeypatch.setattr(run, "local_parity", fake_local)
    monkeypatch.setattr(run, "variant_parity", lambda *a, **k: [])
    monkeypatch.setattr(run, "LazyModules", _Modules)
    monkeypatch.setattr(run, "LazyTorchModules", _Modules)
    (tmp_path / "manifest.json").write_text('{"build_key": "k"}')
    spec = SimpleNamespace(name="m", all_parity_sizes=lambda: [{}])
    prep = SimpleNamespace(target=SimpleNamespace(model="toy", preset="tiny", ckpt=None), specs=[spec],
                           policy=Policy(None, {"version": 0, "precisions": {}}), timings={}, loaded=None,
                           port=SimpleNamespace(e2e_parity=e2e_parity))
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        summary = run.run_parity(prep, tmp_path)
        assert torch.get_num_threads() == 2 and not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.set_num_threads(saved)
    assert seen == [("local", 1, True), ("e2e", 1, True)]
    assert summary["reference"] == {"torch_threads": 1, "deterministic_algorithms": True}
    assert summary["machine"]["cpu_model"]
