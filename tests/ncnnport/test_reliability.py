"""Builds that survive concurrency and faults; rebuilds that say why and never delete a user's file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ncnnport.fsutil import atomic_write_text, read_json
from tests.ncnnport.test_resume import Interrupted, _prepared

REPO = Path(__file__).resolve().parents[2]


def test_atomic_writes_get_the_mode_of_an_ordinary_file(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644   # mkstemp alone gives 0600


def _hold_lock(folder: Path, seconds: float) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import sys, time
        from ncnnport.fsutil import build_lock
        with build_lock({str(folder)!r}):
            print("held", flush=True)
            time.sleep({seconds})
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_fails_fast_naming_the_holder(tmp_path):
    from ncnnport.fsutil import BuildLocked, build_lock

    proc = _hold_lock(tmp_path / "b", 30)
    try:
        with pytest.raises(BuildLocked, match=f"in use by pid {proc.pid} "):
            with build_lock(tmp_path / "b", timeout=0):
                pass
    finally:
        proc.kill()
        proc.wait()
    with build_lock(tmp_path / "b", timeout=0):  # the kernel released the dead holder's lock
        pass


def test_export_waits_for_the_holder_of_its_build_folder(tmp_path, capsys):
    from ncnnport.stages import export_stage

    prep = _prepared(tmp_path, [], set())
    proc = _hold_lock(prep.target.root, 1.5)
    t0 = time.monotonic()
    export_stage(prep)
    proc.wait()
    assert time.monotonic() - t0 > 0.5
    assert f"is in use by pid {proc.pid}" in capsys.readouterr().err


# --- convert with a fake pnnx: resume, rebuild reasons, foreign files -----------------------------
def _fake_convert(calls: list[str], fail: set[str]):
    def convert(rec, torchscript, out_dir, **kw):
        calls.append(rec["name"])
        if rec["name"] in fail:
            fail.discard(rec["name"])
            raise Interrupted(rec["name"])
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out_dir / f"{rec['name']}.ncnn.param", "7767517\n0 0\n")
        atomic_write_text(out_dir / f"{rec['name']}.ncnn.bin", rec["name"] * 16)
        return {"module": rec["name"], "pnnx_peak_rss_mb": 1.0, "variants": []}
    return convert


def test_resume_rehashes_leftovers_and_redoes_a_changed_one(tmp_path, monkeypatch, capsys):
    import ncnnport.stages as stages

    prep = _prepared(tmp_path, [], set())
    calls: list[str] = []
    monkeypatch.setattr(stages, "convert_module", _fake_convert(calls, {"toy_c"}))
    with pytest.raises(Interrupted):
        stages.convert_stage(prep)
    partial = prep.target.package_dir.with_name("package.partial")
    (partial / "ncnn" / "toy_a.ncnn.bin").write_text("damaged")
    calls.clear()
    pkg = stages.convert_stage(prep)
    assert calls == ["toy_a", "toy_c"]            # toy_b kept, toy_a redone, toy_c finished
    assert "convert redoes toy_a: ncnn/toy_a.ncnn.bin: receipt sha256" in capsys.readouterr().err
    assert (pkg / "ncnn" / "toy_a.ncnn.bin").read_text() == "toy_a" * 16
    assert read_json(pkg / "manifest.json")["modules"] == ["toy_a", "toy_b", "toy_c"]


def test_a_rebuild_names_what_changed(tmp_path, monkeypatch, capsys):
    import ncnnport.stages as stages

    prep = _prepared(tmp_path, [], set())
    prep.key_parts = {"code": {"models/toy/model.py": "a" * 64}, "preset": "tiny"}
    monkeypatch.setattr(stages, "convert_module", _fake_convert([], set()))
    stages.convert_stage(prep)
    capsys.readouterr()
    prep.key_parts = {"code": {"models/toy/model.py": "b" * 64}, "preset": "tiny"}
    prep.build_key = "key-2"
    stages.convert_stage(prep)
    err = capsys.readouterr().err
    assert f"exporting: code models/toy/model.py: {'a' * 12} -> {'b' * 12}" in err
    assert f"converting: code models/toy/model.py: {'a' * 12} -> {'b' * 12}" in err
    # a damaged package is rebuilt naming the damaged file
    (prep.target.package_dir / "ncnn" / "toy_b.ncnn.bin").write_text("x")
    stages.convert_stage(prep)
    assert "converting: package: ncnn/toy_b.ncnn.bin: size 1" in capsys.readouterr().err


def test_a_rebuild_never_deletes_a_file_it_did_not_write(tmp_path, monkeypatch):
    import ncnnport.stages as stages

    prep = _prepared(tmp_path, [], set())
    monkeypatch.setattr(stages, "convert_module", _fake_convert([], set()))
    pkg = stages.convert_stage(prep)
    (pkg / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"refusing to delete it for a rebuild.*'notes.txt'"):
        stages.convert_stage(prep, force=True)
    assert (pkg / "notes.txt").read_text() == "mine"
    (pkg / "notes.txt").unlink()
    (prep.target.torchscript_dir / "my_trace_notes.md").write_text("mine")
    with pytest.raises(ValueError, match="my_trace_notes.md"):
        stages.export_stage(prep, force=True)
    assert (prep.target.torchscript_dir / "my_trace_notes.md").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_killed_convert_kills_pnnx_and_removes_its_work_folder(tmp_path, sig):
    fake = tmp_path / "fake_pnnx.py"
    fake.write_text(f"#!{sys.executable}\nimport os, time\nopen({str(tmp_path / 'child.pid')!r}, 'w').write(str(os.getpid()))\n"
                    "time.sleep(60)\n")
    fake.chmod(0o755)
    (tmp_path / "t.pt").write_bytes(b"x")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    spec = {"name": "m", "inputs": [{"name": "x", "shape": [1, "n"], "dtype": "float32"}],
            "outputs": [{"name": "y"}], "axes": {"n": [4, 8]}}
    code = textwrap.dedent(f"""
        import sys, json
        from pathlib import Path
        import ncnnport.convert.pnnx_runner as r
        r.pnnx_executable = lambda: {str(fake)!r}
        r.convert_module(json.loads({json.dumps(json.dumps(spec))}), Path({str(tmp_path / 't.pt')!r}),
                         Path({str(tmp_path / 'out')!r}))
    """)
    # SIGINT at its default disposition in the child whatever the test runner inherited: a job
    # started in the background by a non-interactive shell has SIGINT ignored, which Python keeps
    # (it then installs no KeyboardInterrupt handler), and the interrupt this test sends would be lost
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "TMPDIR": str(tmpdir)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    pid_file = tmp_path / "child.pid"
    for _ in range(300):
        if pid_file.is_file() and pid_file.read_text():
            break
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert list(tmpdir.iterdir())                       # pnnx's work folder exists while it runs
    proc.send_signal(sig)
    proc.wait(timeout=20)
    time.sleep(0.2)
    alive = Path(f"/proc/{child}").exists() and Path(f"/proc/{child}/stat").read_text().split()[2] != "Z"
    if alive:
        os.kill(child, signal.SIGKILL)                  # do not leave the orphan behind
    assert not alive, "pnnx outlived the killed convert"
    assert list(tmpdir.iterdir()) == []
    assert proc.returncode != 0
