"""Replaying dumped reference cases judges every sweep variant by its mode's derived budget."""

import json
from pathlib import Path

import numpy as np

from ncnnport.parity import isa_replay
from ncnnport.parity.policy import Policy

ROOT = Path(__file__).resolve().parents[2]


class FakeModules:
    """ncnn stand-in whose output error is the unit roundoff of the options' storage format
    times ``amplification`` (fp32: exact)."""

    amplification = 1.0

    def __init__(self, package, options) -> None:
        self.u = 2.0 ** -8 if options.bf16_storage else 2.0 ** -11 if options.fp16_storage else 0.0

    def __getitem__(self, name):
        fake = self

        class Runner:
            def run(self, arrays):
                x = arrays[0]
                return [x * (1 + fake.amplification * fake.u * np.sign(np.sin(np.arange(x.size)))).reshape(x.shape)]
        return Runner()

    def release_all(self) -> None:
        pass


def write_cases(tmp_path: Path) -> Path:
    cases = tmp_path / "cases"
    cases.mkdir()
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    np.savez(cases / "m.0.npz", in0=x, ref0=x)
    (cases / isa_replay.INDEX).write_text(json.dumps(
        [{"file": "m.0.npz", "module": "m", "sizes": {}, "outputs": [{"name": "y", "feature_axis": -1}]}]))
    pkg = tmp_path / "package"
    pkg.mkdir()
    (pkg / "manifest.json").write_text("{}")
    return cases


def test_replay_passes_within_the_rule_and_fails_beyond_it(tmp_path, monkeypatch):
    import ncnnport.runtime.lazy_modules as lm

    monkeypatch.setattr(lm, "LazyModules", FakeModules)
    cases = write_cases(tmp_path)
    policy = Policy.load(ROOT / "models" / "youtu_vl" / "policy.json")  # kappa 4, margin 2
    FakeModules.amplification = 4.0
    rows = isa_replay.replay(tmp_path / "package", cases, policy)
    assert [r["variant"] for r in rows][:3] == ["fp32 threads=1", "fp32 threads=2", "fp16-storage"]
    assert all(r["passed"] for r in rows), rows
    bf16 = next(r for r in rows if r["precision"] == "bf16")
    assert np.isclose(bf16["worst_rel_max_abs"], 4.0 * 2.0 ** -8, rtol=1e-3)
    FakeModules.amplification = 12.0  # beyond margin x kappa = 8: every reduced mode fails
    rows = isa_replay.replay(tmp_path / "package", cases, policy)
    assert [r["passed"] for r in rows if r["precision"] != "fp32"] == [False] * 4


def test_replay_cli_names_a_missing_file(tmp_path, capsys):
    from ncnnport.cli import main

    assert main(["isa-replay", "replay", str(tmp_path / "pkg"), str(tmp_path), str(tmp_path / "p.json")]) == 2
    assert "manifest.json not found" in capsys.readouterr().err
