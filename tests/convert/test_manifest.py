import json

from ncnnport.convert.manifest import check_package, write_manifest


def make_package(root):
    (root / "ncnn").mkdir(parents=True)
    (root / "ncnn" / "a.ncnn.param").write_text("7767517\n0 0\n")
    (root / "ncnn" / "a.ncnn.bin").write_bytes(b"\x01" * 64)
    write_manifest(root, model="toy", source="preset:tiny", config_hash="c", build_key="k",
                   commands=[{"module": "a", "command": ["pnnx", "a.pt", "fp16=0"]}])
    return root


def test_clean_package_passes_and_records_versions(tmp_path):
    root = make_package(tmp_path / "pkg")
    assert check_package(root) == []
    manifest = json.loads((root / "manifest.json").read_text())
    assert set(manifest["files"]) == {"ncnn/a.ncnn.param", "ncnn/a.ncnn.bin"}
    assert manifest["versions"]["pnnx"] and manifest["versions"]["ncnn"]
    assert str(tmp_path) not in (root / "manifest.json").read_text()


def test_missing_extra_changed_and_unsafe_are_reported(tmp_path):
    root = make_package(tmp_path / "pkg")
    (root / "ncnn" / "a.ncnn.bin").write_bytes(b"\x02" * 64)       # same size, other bytes
    (root / "ncnn" / "stray.bin").write_bytes(b"x")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"]["../outside.txt"] = {"sha256": "0", "size": 1}
    manifest["files"]["ncnn/gone.param"] = {"sha256": "0", "size": 1}
    (root / "manifest.json").write_text(json.dumps(manifest))
    problems = "\n".join(check_package(root))
    assert "ncnn/a.ncnn.bin: sha256 differs" in problems
    assert "ncnn/stray.bin: extra file" in problems
    assert "unsafe path in manifest: '../outside.txt'" in problems
    assert "ncnn/gone.param: missing" in problems


def test_truncated_file_is_a_size_mismatch(tmp_path):
    root = make_package(tmp_path / "pkg")
    (root / "ncnn" / "a.ncnn.bin").write_bytes(b"\x01" * 10)
    assert check_package(root) == ["ncnn/a.ncnn.bin: size 10, manifest 64"]


def test_no_manifest(tmp_path):
    assert "no manifest" in check_package(tmp_path)[0]
