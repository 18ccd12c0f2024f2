import json

from ncnnport.package.manifest import check_package, write_manifest


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


def _package_of(root, modules, listed):
    (root / "ncnn").mkdir(parents=True)
    (root / "specs").mkdir()
    for m in modules:
        (root / "ncnn" / f"{m}.ncnn.param").write_text("7767517\n0 0\n")
        (root / "ncnn" / f"{m}.ncnn.bin").write_bytes(b"\x01" * 8)
        (root / "specs" / f"{m}.spec.json").write_text("{}")
    write_manifest(root, model="toy", source="preset:tiny", config_hash="c", build_key="k",
                   commands=[{"module": m} for m in modules], modules=listed)
    return root


def test_a_package_holding_3_of_10_graphs_is_not_ok(tmp_path):
    names = [f"layer{i}" for i in range(10)]
    # a manifest rewritten to match the 3 graphs left: only the module list can tell
    root = _package_of(tmp_path / "pkg", names[:3], listed=None)
    assert check_package(root) == []
    problems = check_package(root, expected=names)
    assert problems[0].startswith("holds 3 of 10 modules; missing: layer3, layer4")
    # the module list recorded at build time catches it without the port
    root2 = _package_of(tmp_path / "pkg2", names[:3], listed=names)
    assert "holds 3 of 10 modules" in check_package(root2)[0]
    assert check_package(_package_of(tmp_path / "pkg3", names, listed=names)) == []


def test_a_graph_without_its_weights_is_reported(tmp_path):
    root = _package_of(tmp_path / "pkg", ["a", "b"], listed=["a", "b"])
    (root / "ncnn" / "b.ncnn.bin").unlink()
    manifest = json.loads((root / "manifest.json").read_text())
    del manifest["files"]["ncnn/b.ncnn.bin"]
    (root / "manifest.json").write_text(json.dumps(manifest))
    assert check_package(root) == ["holds 1 of 2 modules; missing: b"]


def test_a_manifest_with_wrong_types_is_a_problem_not_a_crash(tmp_path):
    root = make_package(tmp_path / "pkg")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"]["ncnn/a.ncnn.bin"] = "abc"
    (root / "manifest.json").write_text(json.dumps(manifest))
    assert "field 'files'['ncnn/a.ncnn.bin'] must be" in check_package(root)[0]
    (root / "manifest.json").write_text("[1, 2]")
    assert "manifest must be a JSON object, got list" in check_package(root)[0]
