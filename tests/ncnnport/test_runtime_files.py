"""convert's package description step: model.json, runtime files and e2e cases from the port."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from ncnnport.package.cases import PackageCase, read_cases
from ncnnport.stages import STREAM_TRACES_ABOVE, write_runtime_files


class FakePort:
    def __init__(self, files=None):
        self.files = files or {"assets/emb.npy": b"\x93NUMPY"}
        self.cases_computed = 0

    def runtime_description(self, loaded):
        return {"dims": {"hidden": 4}, "files": {"embedding": "assets/emb.npy"}}

    def runtime_files(self, loaded):
        return self.files

    def package_cases(self, loaded):
        self.cases_computed += 1
        return [PackageCase(f"c{i}", {"in.bin": b"x"}, {"x": "in.bin"}, {"token_ids": [i]}) for i in range(2)]


def _prep(port):
    return SimpleNamespace(port=port, loaded=None, target=SimpleNamespace(model="toy"))


def test_description_files_and_cases_are_written(tmp_path):
    write_runtime_files(_prep(FakePort()), tmp_path, weight_bytes=1 << 20)
    assert json.loads((tmp_path / "model.json").read_text())["model"] == "toy"
    assert (tmp_path / "assets" / "emb.npy").read_bytes() == b"\x93NUMPY"
    assert [c.name for c in read_cases(tmp_path)] == ["c0", "c1"]


def test_cases_are_left_out_above_the_streaming_limit(tmp_path, capsys):
    port = FakePort()
    write_runtime_files(_prep(port), tmp_path, weight_bytes=STREAM_TRACES_ABOVE + 1)
    assert port.cases_computed == 0 and not (tmp_path / "cases").exists()
    assert (tmp_path / "model.json").is_file()
    assert "package e2e cases left out" in capsys.readouterr().err


def test_a_runtime_file_outside_assets_is_refused(tmp_path):
    with pytest.raises(ValueError, match="runtime file '../evil' must lie under assets/"):
        write_runtime_files(_prep(FakePort({"../evil": b"x"})), tmp_path)
