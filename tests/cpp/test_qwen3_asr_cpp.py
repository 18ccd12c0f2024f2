"""The Qwen3-ASR C++ executable (runtime/cpp/apps/qwen3_asr) and ``parity --runtime cpp``.

Slow tests build it (`make cpp`, ncnn from the version-keyed cache), convert the tiny preset and
compare the executable with the torch-free Python package loop (models/qwen3_asr/packaged.py)
token id for token id on 16 kHz mono, 44.1 kHz stereo PCM16 and a cut (two-chunk) input, with at
least 128 new tokens on one of them. Fast tests cover the generic driver's judging and refusals.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ncnnport.drivers import cpp_parity
from ncnnport.registry import CppCase

ROOT = Path(__file__).resolve().parents[2]
EXE = Path(os.environ.get("NCNNPORT_CPP_BUILD", ROOT / "build" / "cpp")) / "ncnnport-qwen3-asr"
NEW_TOKENS = 160


# ---------------------------------------------------------------------------------------------
# the generic driver (no build)


def case(python, reference=None) -> CppCase:
    return CppCase(fixture="fx", argv=[], python_tokens=python, reference_tokens=reference or python)


def test_sequence_records_name_the_first_differing_position():
    rows = cpp_parity.sequence_records(case([[5, 6, 7, 8]]), [[5, 6, 9, 8]])
    vs_python = next(r for r in rows if r["stage"] == "tokens (cpp vs python package loop)")
    assert vs_python["runtime"] == "cpp" and not vs_python["passed"]
    assert vs_python["first_mismatch"] == 2 and vs_python["tokens_matched"] == 2
    assert "first mismatch at step 2" in vs_python["reason"]


def test_sequence_records_pass_only_identical_chunks():
    rows = cpp_parity.sequence_records(case([[1, 2], [3]]), [[1, 2], [3]])
    assert [r["fixture"] for r in rows] == ["fx[0]", "fx[0]", "fx[1]", "fx[1]"] and all(r["passed"] for r in rows)
    missing = cpp_parity.sequence_records(case([[1, 2], [3]]), [[1, 2]])
    assert not all(r["passed"] for r in missing)
    assert any(r["stage"] == "chunks" and "1 chunks, python 2" in r["reason"] for r in missing)


def test_coverage_row_needs_128_identical_tokens():
    def rows(n):
        return cpp_parity.sequence_records(case([list(range(n))]), [list(range(n))])
    assert not cpp_parity.coverage_record(rows(127))["passed"]
    assert cpp_parity.coverage_record(rows(128))["passed"]


def test_missing_executable_names_the_make_command(tmp_path, monkeypatch):
    monkeypatch.setenv("NCNNPORT_CPP_BUILD", str(tmp_path))
    with pytest.raises(cpp_parity.CppRuntimeError, match=r"make -C .* cpp"):
        cpp_parity.find_executable("ncnnport-nothing")


def test_executable_failure_is_one_line(tmp_path):
    exe = tmp_path / "fake"
    exe.write_text("#!/bin/sh\necho 'fake: input.wav: not a readable audio file' >&2\nexit 2\n")
    exe.chmod(0o755)
    with pytest.raises(cpp_parity.CppRuntimeError, match="exited 2: fake: input.wav: not a readable"):
        cpp_parity.run_executable(exe, [], tmp_path / "out.json")


def test_parity_refuses_a_model_without_a_cpp_hook(monkeypatch, capsys):
    from ncnnport import cli

    port = SimpleNamespace(cpp_executable=None, validate_inputs=lambda paths: None)
    monkeypatch.setattr(cli, "get_port", lambda name: port)
    assert cli.main(["parity", "qwen3-asr", "--runtime", "cpp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no C++ runtime" in err[0]


def test_runtime_cpp_refuses_python_only_options(capsys):
    from ncnnport import cli

    assert cli.main(["parity", "qwen3-asr", "--runtime", "cpp", "--sweep"]) == 2
    assert "drop --sweep" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# the executable on a tiny package (slow: builds and converts)


@pytest.fixture(scope="module")
def exe(built_cpp) -> Path:
    return built_cpp(EXE, "NCNNPORT_CPP_BUILD")


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    from ncnnport.stages import convert_stage, prepare
    from ncnnport.targets import Target

    return Path(convert_stage(prepare(Target("qwen3-asr", "tiny", None, tmp_path_factory.mktemp("qwen")))))


@pytest.fixture(scope="module")
def audio_files(tmp_path_factory) -> dict[str, tuple[Path, float | None]]:
    """name -> (file, one-pass limit): 16 kHz mono float, 44.1 kHz stereo PCM16, a 2-chunk cut."""
    import soundfile as sf

    from ncnnport.models.qwen3_asr.fixtures import synth_speechlike

    d = tmp_path_factory.mktemp("audio")
    mono = d / "mono16k.wav"
    sf.write(str(mono), synth_speechlike(3.0, seed=5), 16000, subtype="FLOAT")
    left, right = synth_speechlike(4.0 * 44100 / 16000, seed=6), synth_speechlike(4.0 * 44100 / 16000, seed=7)
    stereo = d / "stereo44k.wav"
    sf.write(str(stereo), np.stack([left, 0.5 * right], axis=1), 44100, subtype="PCM_16")
    cut = d / "cut9s.flac"
    sf.write(str(cut), synth_speechlike(9.0, seed=8), 16000, subtype="PCM_24")
    return {"mono16k": (mono, None), "stereo44k": (stereo, None), "cut9s": (cut, 6.0)}


def run_cpp(exe: Path, package: Path, audio: Path, out: Path, limit: float | None = None,
            *extra: str) -> subprocess.CompletedProcess:
    argv = [str(exe), "--package", str(package), "--audio", str(audio), "--max-new-tokens", str(NEW_TOKENS),
            "--json-out", str(out), *extra]
    if limit is not None:
        argv += ["--max-chunk-seconds", str(limit)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)


def python_loop(package: Path, audio: Path, limit: float | None):
    from ncnnport.fsutil import read_json
    from ncnnport.models.qwen3_asr import packaged
    from ncnnport.models.qwen3_asr.audio import read_audio
    from ncnnport.runtime.lazy_modules import LazyModules

    asr = packaged.open_packaged(package, read_json(package / "model.json"), LazyModules(package))
    return packaged.transcribe(asr, read_audio(audio), max_new_tokens=NEW_TOKENS, max_chunk_seconds=limit)


@pytest.mark.slow
def test_cpp_tokens_equal_the_python_package_loop(exe, package, audio_files, tmp_path):
    longest = 0
    for name, (audio, limit) in audio_files.items():
        res = run_cpp(exe, package, audio, tmp_path / f"{name}.json", limit)
        assert res.returncode == 0, res.stderr
        got = json.loads((tmp_path / f"{name}.json").read_text())
        want = python_loop(package, audio, limit)
        cpp_tokens = [c["token_ids"] for c in got["chunks"]]
        assert cpp_tokens == want.token_ids, name
        assert (got["text"], got["language"]) == (want.text, want.language), name
        if name == "cut9s":
            assert len(cpp_tokens) == 2
        timing = got["timing"]  # the decode layers' share of the decode graphs (item 2's flatness)
        assert 0 < timing["decode_layers_s"] < timing["decode_graph_s"], timing
        # of which the weights' one-row streams, where ncnnport's kernel serves the InnerProducts
        if timing["gemv"].startswith("ncnnport-"):
            assert 0 < timing["decode_layers_stream_s"] < timing["decode_layers_s"], timing
        longest = max(longest, *map(len, cpp_tokens))
    assert longest >= 128


@pytest.mark.slow
def test_forced_language_matches_the_python_package_loop(exe, package, audio_files, tmp_path):
    from ncnnport.fsutil import read_json
    from ncnnport.models.qwen3_asr import packaged
    from ncnnport.models.qwen3_asr.audio import read_audio
    from ncnnport.runtime.lazy_modules import LazyModules

    audio = audio_files["mono16k"][0]
    assert run_cpp(exe, package, audio, tmp_path / "o.json", None, "--language", "eNGLISH").returncode == 0
    got = json.loads((tmp_path / "o.json").read_text())
    asr = packaged.open_packaged(package, read_json(package / "model.json"), LazyModules(package))
    want = packaged.transcribe(asr, read_audio(audio), language="eNGLISH", max_new_tokens=NEW_TOKENS)
    assert [c["token_ids"] for c in got["chunks"]] == want.token_ids
    assert (got["language"], got["text"]) == ("English", want.text)
    refused = run_cpp(exe, package, audio, tmp_path / "o.json", None, "--language", "en")
    assert refused.returncode == 2 and "unsupported language 'En'" in refused.stderr


@pytest.mark.slow
def test_cpp_log_mel_matches_features_py(exe, package, audio_files, tmp_path):
    from ncnnport.models.qwen3_asr.audio import read_audio
    from ncnnport.models.qwen3_asr.features import extract_features

    for name, (audio, _) in audio_files.items():
        mel = tmp_path / f"{name}.f32"
        assert run_cpp(exe, package, audio, tmp_path / "o.json", None, "--mel-out", str(mel)).returncode == 0
        want = extract_features(read_audio(audio)).features[0]
        got = np.fromfile(mel, dtype=np.float32).reshape(want.shape)
        assert np.abs(got - want).max() <= 2e-6, name


@pytest.mark.slow
def test_bad_inputs_are_one_line_exit_2(exe, package, audio_files, tmp_path):
    import soundfile as sf

    not_audio = tmp_path / "x.wav"
    not_audio.write_bytes(b"RIFF nonsense")
    short = tmp_path / "short.wav"
    sf.write(str(short), np.zeros(150, np.float32), 16000)
    tampered = tmp_path / "pkg"
    shutil.copytree(package, tampered)
    with open(tampered / "ncnn" / "lm_head.ncnn.param", "a") as f:
        f.write("\n")
    mono = audio_files["mono16k"][0]
    cases = [(package, not_audio, str(not_audio)), (package, tmp_path / "missing.flac", "missing.flac"),
             (package, short, "too short"), (tampered, mono, "lm_head.ncnn.param"),
             (tmp_path / "nowhere", mono, "nowhere")]
    for pkg, audio, needle in cases:
        res = run_cpp(exe, pkg, audio, tmp_path / "o.json")
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and needle in lines[0], (needle, res.stderr)


@pytest.mark.slow
def test_prompt_ids_disagreeing_with_the_tokenizer_are_refused(exe, package, audio_files, tmp_path):
    edited = tmp_path / "pkg"
    shutil.copytree(package, edited)
    doc = json.loads((edited / "model.json").read_text())
    doc["prompt"]["prefix_ids"][1] += 1
    (edited / "model.json").write_text(json.dumps(doc))
    res = run_cpp(exe, edited, audio_files["mono16k"][0], tmp_path / "o.json", None, "--no-check")
    assert res.returncode == 2 and "prompt.prefix_ids" in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_parity_runtime_cpp_rows(exe, package, audio_files, monkeypatch):
    from ncnnport.stages import prepare
    from ncnnport.targets import Target

    monkeypatch.setenv("NCNNPORT_CPP_BUILD", str(exe.parent))
    prep = prepare(Target("qwen3-asr", "tiny", None, package.parents[2]))
    stereo = audio_files["stereo44k"][0]
    summary = cpp_parity.run_cpp_parity(prep, package, user_inputs=[stereo])
    assert summary["runtime"] == "cpp" and summary["gates_passed"]
    assert all(r["runtime"] == "cpp" for r in summary["e2e"])
    assert any(r["fixture"] == f"input:{stereo.name}" for r in summary["e2e"])
    assert any(r["fixture"].startswith("speech_65s_cut25[1]") for r in summary["e2e"])
