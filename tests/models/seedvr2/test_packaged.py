"""The torch-free SeedVR2 runtime's package reading: what it needs beyond the graphs, and one
clear error naming the file and field when a package lacks it (a package built before the
torch-free runtime has no host tables)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from ncnnport.models.seedvr2.config import TINY
from ncnnport.models.seedvr2.describe import HOST_TABLES, TEXT_EMBEDDING, host_tables_npz
from ncnnport.models.seedvr2.packaged import open_packaged
from ncnnport.package.model_json import PackageError


def _package(tmp_path, files: dict[str, str]) -> dict:
    (tmp_path / "assets").mkdir()
    np.save(tmp_path / TEXT_EMBEDDING, np.zeros((TINY.text_len, TINY.dit.txt_in_dim), np.float32))
    (tmp_path / HOST_TABLES).write_bytes(host_tables_npz(TINY))
    return {"model": "seedvr2", "config": TINY.to_json(), "files": files}


def test_opens_config_text_and_tables(tmp_path):
    rt = open_packaged(tmp_path, _package(tmp_path, {"text_embedding": TEXT_EMBEDDING, "host_tables": HOST_TABLES}))
    assert rt.cfg == TINY and rt.text.shape == (TINY.text_len, TINY.dit.txt_in_dim)
    assert rt.trig.cos.shape[0] == TINY.text_len + 1024 and rt.trig.timestep == TINY.timestep


def test_a_package_without_host_tables_names_the_field(tmp_path):
    doc = _package(tmp_path, {"text_embedding": TEXT_EMBEDDING})
    with pytest.raises(PackageError, match=r"model.json: field 'files.host_tables' missing .*rebuild it"):
        open_packaged(tmp_path, doc)


def test_host_tables_without_an_array_name_the_file(tmp_path):
    doc = _package(tmp_path, {"text_embedding": TEXT_EMBEDDING, "host_tables": HOST_TABLES})
    buf = io.BytesIO()
    np.savez(buf, rope_cos=np.zeros((3, 2), np.float32))
    (tmp_path / HOST_TABLES).write_bytes(buf.getvalue())
    with pytest.raises(PackageError, match=r"host_tables.npz: arrays \['rope_sin', 'sinusoid'\] missing"):
        open_packaged(tmp_path, doc)


def test_a_config_field_missing_names_model_json(tmp_path):
    doc = _package(tmp_path, {"text_embedding": TEXT_EMBEDDING, "host_tables": HOST_TABLES})
    del doc["config"]["timestep"]
    with pytest.raises(PackageError, match="model.json"):
        open_packaged(tmp_path, doc)
