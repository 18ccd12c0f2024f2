"""What the build key covers: a change to export/convert code or a model's graphs re-exports; a
change to a model's measurement modules (bench workloads) does not."""

from __future__ import annotations

import pytest

from ncnnport.targets import _code_files, bench_only


@pytest.mark.parametrize("model", ["qwen3-asr", "youtu-vl", "seedvr2"])
def test_the_key_covers_the_graphs_code_but_not_the_bench_modules(model):
    files = {path.name for _, path in _code_files(model)}
    folder = {p.parent for _, p in _code_files(model) if p.name == "specs.py"}
    assert {"specs.py", "port.py", "wrappers.py"} <= files and len(folder) == 1
    measured = sorted(p.name for p in next(iter(folder)).glob("*.py") if bench_only(p))
    assert "bench.py" in measured and "cpp_bench.py" in measured  # the files this test is about exist
    assert not files & set(measured)


def test_bench_only_is_a_naming_rule(tmp_path):
    for name, only in {"bench.py": True, "cpp_bench.py": True, "vision_bench.py": True, "tile_measure.py": True,
                       "specs.py": False, "benchmarks.json": False, "measure.py": False}.items():
        assert bench_only(tmp_path / name) is only, name
