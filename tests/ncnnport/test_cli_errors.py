"""User errors end in one line naming the file and exit status 2, never a traceback."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch

from ncnnport.cli import main
from tests.reports.test_reports import summary as toy_summary


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err
    assert len(lines) == 1, err
    return lines[0]


def _report_folder(build: Path, model: str = "qwen3-asr") -> Path:
    folder = build / "reports" / model
    folder.mkdir(parents=True)
    s = toy_summary()
    s["model"] = model
    (folder / "summary.json").write_text(json.dumps(s))
    return folder


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_full_or_read_only_disk_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys, code):
    import ncnnport.fsutil as fsutil

    folder = _report_folder(tmp_path)

    def full(fd, data):
        os.close(fd)
        raise OSError(code, os.strerror(code))  # what write() raises: no file name

    monkeypatch.setattr(fsutil, "_write_fd", full)
    assert main(["report", "qwen3-asr", "--build-dir", str(tmp_path)]) == 2
    line = _one_error_line(capsys)
    assert str(folder / "summary.json") in line and os.strerror(code) in line
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]   # no temp file left


def test_permission_denied_names_the_folder(tmp_path, monkeypatch, capsys):
    import ncnnport.fsutil as fsutil

    _report_folder(tmp_path)

    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "reports"))

    monkeypatch.setattr(fsutil.tempfile, "mkstemp", denied)
    assert main(["report", "qwen3-asr", "--build-dir", str(tmp_path)]) == 2
    assert f"{tmp_path / 'reports'}: Permission denied" in _one_error_line(capsys)


def test_a_file_given_as_the_package_folder(tmp_path, capsys):
    f = tmp_path / "pkg.json"
    f.write_text("{}")
    assert main(["check", "--package", str(f)]) == 2
    assert f"{f}: a package is a folder" in _one_error_line(capsys)


def test_a_directory_without_summary_given_to_compare(tmp_path, capsys):
    _report_folder(tmp_path)
    empty = tmp_path / "old"
    empty.mkdir()
    assert main(["report", "qwen3-asr", "--build-dir", str(tmp_path), "--compare", str(empty)]) == 2
    assert f"{empty / 'summary.json'}: no summary.json there" in _one_error_line(capsys)


def test_a_manifest_with_wrong_json_types_is_one_line_naming_the_field(tmp_path, capsys):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "manifest.json").write_text(json.dumps({"files": ["ncnn/a.ncnn.param"]}))
    assert main(["check", "--package", str(pkg)]) == 2
    line = _one_error_line(capsys)
    assert str(pkg / "manifest.json") in line and "field 'files' must be an object, got list" in line
    (pkg / "manifest.json").write_text(json.dumps({"files": {"a": {"sha256": 1, "size": "2"}}}))
    assert main(["check", "--package", str(pkg)]) == 2
    assert "field 'files'['a']" in _one_error_line(capsys)


def test_non_utf8_file_names_are_printed_escaped(tmp_path, capsys):
    from ncnnport.package.manifest import write_manifest

    pkg = tmp_path / "pkg"
    (pkg / "ncnn").mkdir(parents=True)
    write_manifest(pkg, model="toy", source="preset:tiny", config_hash="c", build_key="k", commands=[])
    (pkg / os.fsdecode(b"ncnn/caf\xe9.bin")).write_bytes(b"x")       # a Latin-1 name
    assert main(["check", "--package", str(pkg)]) == 1
    out = capsys.readouterr().out
    assert "ncnn/caf\\xe9.bin: extra file not in manifest" in out
    missing = tmp_path / os.fsdecode(b"\xff\xfe-old")
    assert main(["report", "qwen3-asr", "--build-dir", str(tmp_path), "--compare", str(missing)]) == 2
    assert "\\xff\\xfe-old" in _one_error_line(capsys)


def _checkpoint(folder: Path, tensors: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_a_corrupted_safetensors_header_names_the_file(tmp_path):
    from ncnnport.cli import user_error
    from ncnnport.lazy_weights import SafetensorsSource

    folder = _checkpoint(tmp_path / "ckpt", {"w": torch.ones(2, 2)})
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:16] = b"\x00garbage"                                   # inside the JSON header
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"{path}: not a readable safetensors file") as info:
        SafetensorsSource(folder)
    assert user_error(info.value).startswith(str(path))


def test_non_float_weights_are_refused_naming_tensor_and_file(tmp_path):
    from ncnnport.lazy_weights import SafetensorsSource

    folder = _checkpoint(tmp_path / "ckpt", {"w": torch.ones(2, 2), "ids": torch.arange(4)})
    src = SafetensorsSource(folder)
    assert src.get("w").dtype == torch.float32
    with pytest.raises(ValueError, match=rf"model.safetensors: tensor 'ids' has dtype int64; weights must be float"):
        src.get("ids")
    with pytest.raises(ValueError, match="tensor 'ids'"):
        src.get_rows("ids", 0, 2)


def test_a_broken_index_names_the_file(tmp_path):
    from ncnnport.lazy_weights import checkpoint_shards

    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": [1]}')
    with pytest.raises(ValueError, match="model.safetensors.index.json: field 'weight_map'"):
        checkpoint_shards(tmp_path)


def test_run_help_lists_the_model_options(capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "qwen3-asr", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--audio" in out and "--max-new-tokens" in out and "--low-memory" in out


def test_run_says_seeded_weights_give_filler_before_loading(tmp_path, monkeypatch, capsys):
    import ncnnport.stages as stages

    def stop(*a, **k):
        raise ValueError("stopped before the model load")

    monkeypatch.setattr(stages, "prepare", stop)
    import numpy as np
    import soundfile as sf

    clip = tmp_path / "clip.wav"  # a valid input, so the run gets past input validation
    sf.write(clip, np.zeros(16000, dtype=np.float32), 16000)
    assert main(["run", "qwen3-asr", "--audio", str(clip), "--build-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "stopped before the model load" in err
    assert "runs seeded weights (preset tiny), not a checkpoint" in err and "filler" in err


def test_an_unknown_run_option_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "qwen3-asr", "--audio", "a.wav", "--no-such-option"])
    assert info.value.code == 2


@pytest.mark.parametrize("content,why", [(b"{bad", "not valid JSON"), (b"[1, 2]", "expected a JSON object"),
                                         (b"\xff\xfe", "not valid JSON")])
def test_json_object_reader_names_the_file_in_one_line(tmp_path, content, why):
    """One reader for every config-like JSON (checkpoint configs, model.json): the error type is
    the caller's, the message names the file and what is wrong."""
    from ncnnport.fsutil import read_json_object

    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=why) as info:
        read_json_object(path, ValueError)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(RuntimeError, match="missing.json: unreadable"):
        read_json_object(tmp_path / "missing.json", RuntimeError)
