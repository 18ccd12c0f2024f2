"""`make nightly` keeps one summary per run; the regression compare uses the last passing one."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from ncnnport.targets import Target
from tests.reports.test_reports import summary as toy_summary


def test_history_folders_are_never_reused():
    from ncnnport.nightly import history_dir
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        now = datetime(2026, 12, 1, 3, 0, 0, tzinfo=timezone.utc)
        a, b = history_dir(Path(tmp), now), history_dir(Path(tmp), now)
        assert a.name == "20261201T030000.000000Z" and b.name == "20261201T030000.000000Z-1"


def test_every_nightly_run_keeps_its_summary(tmp_path, monkeypatch, capsys):
    import ncnnport.nightly as nightly
    import ncnnport.stages as stages

    runs = [toy_summary(), toy_summary()]
    runs[1]["modules"][0]["max_abs"] = 1e-3                 # tonight regressed
    monkeypatch.setattr(stages, "prepare", lambda t: t)
    monkeypatch.setattr(stages, "convert_stage", lambda prep: tmp_path)
    monkeypatch.setattr(nightly, "full_parity", lambda prep, pkg: runs.pop(0))
    monkeypatch.setattr(nightly, "stability", lambda prep, pkg: {"passed": True, "rounds": 0})
    monkeypatch.setattr(nightly, "cpp_parity", lambda prep, pkg: {"ran": False, "passed": True, "rows": [],
                                                                   "reason": "toy has no C++ runtime"})
    target = Target("toy", "tiny", None, tmp_path)
    store = tmp_path / "nightly"
    assert nightly.run_nightly([target], store) == 0
    assert nightly.run_nightly([target], store) == 1
    kept = sorted((store / "history").glob("*/toy/summary.json"))
    assert len(kept) == 2
    assert [json.loads(p.read_text())["modules"][0]["max_abs"] for p in kept] == [1e-6, 1e-3]
    assert "max_abs 1e-06 -> 0.001" in capsys.readouterr().out
    # the failing run did not become the baseline
    assert json.loads((store / "toy" / "last_summary.json").read_text())["modules"][0]["max_abs"] == 1e-6


def test_the_ci_matrix_shards_every_model_precision_and_backend():
    """actionlint cannot be installed here (its PyPI wrapper downloads a GitHub binary); this
    keeps the workflow parseable and its matrix in step with the registry."""
    from pathlib import Path

    import yaml

    from ncnnport.registry import KNOWN_MODELS

    wf = yaml.safe_load((Path(__file__).resolve().parents[2] / ".github/workflows/nightly.yml").read_text())
    matrix = wf["jobs"]["parity"]["strategy"]["matrix"]
    assert sorted(matrix["model"]) == sorted(KNOWN_MODELS)
    assert matrix["precision"] == ["fp32", "sweep"] and matrix["backend"] == ["cpu", "vulkan"]
    assert wf["jobs"]["parity"]["strategy"]["fail-fast"] is False
    assert "-n auto" in " ".join(s.get("run", "") for s in wf["jobs"]["tests"]["steps"])
