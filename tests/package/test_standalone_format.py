"""The package's own runtime files: model.json, golden vectors, e2e cases and archives."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile

import numpy as np
import pytest

from ncnnport.package.archive import CHECKSUMS, extract_package, write_archive
from ncnnport.package.cases import PackageCase, read_cases, write_case
from ncnnport.package.golden import GoldenCase, read_golden, write_golden
from ncnnport.package.model_json import SCHEMA_VERSION, PackageError, read_model_json, write_model_json


def _model_json(root, **extra):
    (root / "assets").mkdir(parents=True, exist_ok=True)
    (root / "assets" / "tokenizer.json").write_text("{}")
    return write_model_json(root, "qwen3-asr", {"dims": {"hidden": 8}, "files": {"tokenizer": "assets/tokenizer.json"},
                                                **extra})


def test_model_json_round_trip(tmp_path):
    _model_json(tmp_path)
    doc = read_model_json(tmp_path, expected_model="qwen3-asr")
    assert doc["schema_version"] == SCHEMA_VERSION and doc["dims"] == {"hidden": 8}


@pytest.mark.parametrize("breakage, needle", [
    ("missing", "model.json: missing"),
    ("newer", "field 'schema_version' is 2, newer than this ncnnport reads (1)"),
    ("other", "field 'model' is 'qwen3-asr': a package of another model, not 'youtu-vl'"),
    ("tokenizer", "assets/tokenizer.json: missing (tokenizer named by"),
])
def test_model_json_refusals_name_the_file_and_field(tmp_path, breakage, needle):
    _model_json(tmp_path)
    path = tmp_path / "model.json"
    expected = "youtu-vl" if breakage == "other" else "qwen3-asr"
    if breakage == "missing":
        path.unlink()
    elif breakage == "newer":
        path.write_text(json.dumps({**json.loads(path.read_text()), "schema_version": SCHEMA_VERSION + 1}))
    elif breakage == "tokenizer":
        (tmp_path / "assets" / "tokenizer.json").unlink()
    with pytest.raises(PackageError) as err:
        read_model_json(tmp_path, expected_model=expected)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_golden_round_trip_keeps_sizes_dtypes_and_order(tmp_path):
    rng = np.random.default_rng(0)
    cases = [GoldenCase({"seq": s, "past": 3}, [rng.standard_normal((1, s, 4)).astype(np.float32),
                                                 np.arange(s, dtype=np.int32)[None]],
                        [rng.standard_normal((1, s)).astype(np.float32)]) for s in (5, 9)]
    write_golden(tmp_path / "g.npz", cases)
    back = read_golden(tmp_path / "g.npz")
    assert [c.sizes for c in back] == [{"past": 3, "seq": 5}, {"past": 3, "seq": 9}]
    for a, b in zip(cases, back):
        assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a.inputs + a.outputs, b.inputs + b.outputs))


def test_golden_with_an_object_array_is_refused_not_unpickled(tmp_path):
    buf = io.BytesIO()
    np.savez(buf, **{"case0/sizes": np.array([1]), "case0/in0": np.array([{"x": 1}], dtype=object)})
    (tmp_path / "bad.npz").write_bytes(buf.getvalue())
    with pytest.raises(ValueError, match="bad.npz: not a golden-vector file"):
        read_golden(tmp_path / "bad.npz")


def test_cases_round_trip_and_missing_input_is_named(tmp_path):
    write_case(tmp_path, PackageCase("clip_a", {"in.wav": b"RIFF"}, {"audio": "in.wav"}, {"token_ids": [[1, 2]]},
                                     {"max_new_tokens": 2}))
    (case,) = read_cases(tmp_path)
    assert case.inputs["audio"].read_bytes() == b"RIFF" and case.expected == {"token_ids": [[1, 2]]}
    (tmp_path / "cases" / "clip_a" / "in.wav").unlink()
    with pytest.raises(ValueError, match="in.wav: missing"):
        read_cases(tmp_path)


def _folder(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "ncnn").mkdir(parents=True)
    (pkg / "ncnn" / "a.bin").write_bytes(b"\x01" * 100)
    (pkg / "manifest.json").write_text("{}")
    return pkg


def test_archive_is_reproducible_and_checksums_verify_with_sha256sum(tmp_path):
    pkg = _folder(tmp_path)
    a1 = write_archive(pkg, tmp_path / "out1", "toy-tiny")
    a2 = write_archive(pkg, tmp_path / "out2", "toy-tiny")
    assert a1.read_bytes() == a2.read_bytes()  # no timestamps or owners inside
    assert subprocess.run(["sha256sum", "-c", f"{a1.name}.sha256"], cwd=a1.parent).returncode == 0
    out = extract_package(a1, tmp_path / "x")
    assert out == tmp_path / "x" / "toy-tiny" and (out / "ncnn" / "a.bin").read_bytes() == b"\x01" * 100
    assert subprocess.run(["sha256sum", "-c", str(a1.parent / CHECKSUMS)], cwd=tmp_path / "x").returncode == 0


def _tar_with(tmp_path, member: tarfile.TarInfo, data: bytes = b"x"):
    path = tmp_path / "evil.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        ok = tarfile.TarInfo("pkg/manifest.json")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"{}"))
        member.size = 0 if member.issym() or member.islnk() else len(data)
        tar.addfile(member, None if member.issym() or member.islnk() else io.BytesIO(data))
    return path


def _link(name, target, kind=tarfile.SYMTYPE):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize("member, why", [
    (tarfile.TarInfo("pkg/../escape.txt"), "path with '..'"),
    (tarfile.TarInfo("/etc/pkg.txt"), "absolute path"),
    (_link("pkg/ncnn/a.bin", "/etc/passwd"), "link to '/etc/passwd'"),
    (_link("pkg/ncnn/b.bin", "pkg/manifest.json", tarfile.LNKTYPE), "link to 'pkg/manifest.json'"),
])
def test_unsafe_members_are_refused_naming_the_member_before_anything_is_written(tmp_path, member, why):
    name = member.name
    archive = _tar_with(tmp_path, member)
    with pytest.raises(ValueError) as err:
        extract_package(archive, tmp_path / "x")
    assert f"refusing member {name!r}: {why}" in str(err.value)
    assert not (tmp_path / "x").exists() and not (tmp_path / "escape.txt").exists()
