"""Qwen3-ASR from its package alone: model.json, golden vectors, e2e cases, ``verify``, ``pack``
and ``run --package`` without torch or transformers, equal to today's run path."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ncnnport.targets import Target
from tests.torchfree import blocking_env, cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from ncnnport.stages import convert_stage, prepare

    root = tmp_path_factory.mktemp("pkgbuild")
    prep = prepare(Target("qwen3-asr", "tiny", None, root))
    return prep, convert_stage(prep), root


@pytest.fixture(scope="module")
def no_torch(tmp_path_factory) -> dict[str, str]:
    return blocking_env(tmp_path_factory.mktemp("block"))


def test_the_block_hook_really_blocks_torch(no_torch):
    r = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env=no_torch)
    assert r.returncode != 0 and "torch-free path imported torch" in r.stderr


def test_package_holds_model_json_golden_vectors_and_cases_in_its_manifest(built):
    _, pkg, _ = built
    manifest = json.loads((pkg / "manifest.json").read_text())["files"]
    doc = json.loads((pkg / "model.json").read_text())
    assert doc["schema_version"] == 1 and doc["model"] == "qwen3-asr"
    assert doc["special_ids"]["audio_token_id"] == 517 and doc["special_ids"]["eos_ids"]
    assert doc["files"]["tokenizer"] in manifest and "model.json" in manifest
    for name in json.loads((pkg / "manifest.json").read_text())["modules"]:
        assert f"golden/{name}.npz" in manifest
    cases = sorted(p.parent.name for p in pkg.glob("cases/*/case.json"))
    assert len(cases) >= 2 and all(f"cases/{c}/input.wav" in manifest for c in cases)


def test_prompt_pieces_rebuild_the_processors_ids(built):
    from ncnnport.models.qwen3_asr import packaged
    from ncnnport.models.qwen3_asr.fixtures import synth_speechlike
    from ncnnport.models.qwen3_asr.prompt import build_prompt

    prep, pkg, _ = built
    doc = json.loads((pkg / "model.json").read_text())
    asr = packaged.open_packaged(pkg, doc, {n: None for n in json.loads((pkg / "manifest.json").read_text())["modules"]})
    for seconds in (0.7, 3.0, 31.0):
        wave = synth_speechlike(seconds, 1)
        for language in (None, "English", "Chinese"):
            want = build_prompt(prep.loaded.extra["processor"], wave, language=language)
            assert np.array_equal(asr.prompt_ids(want.num_audio_tokens, language), want.input_ids), (seconds, language)


def test_open_packaged_names_a_graph_left_unopened_and_a_missing_field_apart(built):
    """A graph the caller did not open and a model.json field that is absent are different
    faults: each message says which, naming the graph or the field."""
    from ncnnport.models.qwen3_asr import packaged
    from ncnnport.package.model_json import PackageError

    _, pkg, _ = built
    doc = json.loads((pkg / "model.json").read_text())
    names = json.loads((pkg / "manifest.json").read_text())["modules"]
    with pytest.raises(PackageError, match=r"modules missing: \['lm_head'\]") as unopened:
        packaged.open_packaged(pkg, doc, {n: None for n in names if n != "lm_head"})
    assert "field" not in str(unopened.value)
    broken = dict(doc, special_ids={k: v for k, v in doc["special_ids"].items() if k != "eos_ids"})
    with pytest.raises(PackageError, match="field 'eos_ids' missing"):
        packaged.open_packaged(pkg, broken, {n: None for n in names})


def test_verify_passes_without_torch_on_folder_and_archive(built, no_torch, tmp_path):
    _, pkg, root = built
    r = cli("verify", pkg, env=no_torch)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| case | speech_2s | PASS |" in r.stdout and "| golden | decode_layer0[past=5] | PASS |" in r.stdout
    r = cli("pack", "qwen3-asr", "--build-dir", root, "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    archive = tmp_path / "qwen3-asr-tiny.tar.gz"
    assert subprocess.run(["sha256sum", "-c", archive.name + ".sha256"], cwd=tmp_path).returncode == 0
    r = cli("verify", archive, "--threads", 2, env=no_torch)
    assert r.returncode == 0 and "0 failed" in r.stdout, r.stdout + r.stderr


def _copy(pkg: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "pkg"
    shutil.copytree(pkg, dest)
    return dest


def test_tampered_golden_vector_fails_verify_naming_the_file(built, no_torch, tmp_path):
    _, pkg, _ = built
    bad = _copy(pkg, tmp_path)
    data = bytearray((bad / "golden" / "lm_head.npz").read_bytes())
    data[-200] ^= 0xFF
    (bad / "golden" / "lm_head.npz").write_bytes(bytes(data))
    r = cli("verify", bad, env=no_torch)
    assert r.returncode == 1 and "golden/lm_head.npz: sha256 differs from manifest" in r.stdout
    r = cli("run", "qwen3-asr", "--audio", bad / "cases/speech_2s/input.wav", "--package", bad, env=no_torch)
    assert r.returncode == 2 and "golden/lm_head.npz: sha256 differs" in r.stderr and "never rebuilds" in r.stderr


def test_wrong_graph_output_fails_its_golden_row(built, tmp_path):
    """A package whose graph computes something else (manifest rewritten to match) fails the
    golden row of that graph, not only the e2e cases."""
    from ncnnport.drivers.verify import golden_checks
    from ncnnport.package.manifest import write_manifest
    from ncnnport.package.reader import open_package
    from ncnnport.runtime.options import RuntimeOptions

    _, pkg, _ = built
    bad = _copy(pkg, tmp_path)
    shutil.copyfile(bad / "ncnn" / "decode_layer0.ncnn.bin", bad / "ncnn" / "decode_layer1.ncnn.bin")
    m = json.loads((bad / "manifest.json").read_text())
    write_manifest(bad, model=m["model"], source=m["source"], config_hash=m["config_sha256"], build_key=m["build_key"],
                   commands=m["pnnx_commands"], modules=m["modules"])
    rows = {r.name: r for r in golden_checks(open_package(bad), RuntimeOptions())}
    assert not rows["decode_layer1[past=5]"].passed and rows["decode_layer0[past=5]"].passed


def test_run_package_equals_todays_run_path_without_torch(built, no_torch):
    _, pkg, root = built
    for case, extra in (("speech_5s_english", ()), ("speech_5s_english", ("--language", "English")),
                        ("speech_2s", ("--max-chunk-seconds", "1"))):
        args = ("run", "qwen3-asr", "--audio", pkg / "cases" / case / "input.wav", "--max-new-tokens", 40, *extra)
        old = cli(*args, "--build-dir", root)
        new = cli(*args, "--package", pkg, env=no_torch)
        assert old.returncode == 0 and new.returncode == 0, old.stderr + new.stderr
        assert new.stdout == old.stdout and "text: " in new.stdout


def test_run_package_refusals(built, no_torch, tmp_path):
    _, pkg, _ = built
    audio = pkg / "cases/speech_2s/input.wav"
    bad = _copy(pkg, tmp_path)
    m = json.loads((bad / "manifest.json").read_text())
    (bad / "manifest.json").write_text(json.dumps({**m, "model": "youtu-vl"}))
    r = cli("run", "qwen3-asr", "--audio", audio, "--package", bad, env=no_torch)
    assert r.returncode == 2 and "manifest.json: field 'model' is 'youtu-vl': a package of another model" in r.stderr
    m["versions"]["ncnn"] = "1.0.20200101"
    (bad / "manifest.json").write_text(json.dumps(m))
    r = cli("run", "qwen3-asr", "--audio", audio, "--package", bad, "--max-new-tokens", 3, env=no_torch)
    assert r.returncode == 0 and "package built with ncnn 1.0.20200101, this machine has ncnn 1.0.20261020" in r.stderr
    (bad / "model.json").unlink()
    r = cli("run", "qwen3-asr", "--audio", audio, "--package", bad, env=no_torch)
    assert r.returncode == 2 and "model.json: missing" in r.stderr
