"""aarch64: the cross build's options and cache key, and (slow) `make cpp-aarch64-verify` under
qemu-user: every tiny package's golden vectors pass on the Arm code paths of the same ncnn, and
one packaged e2e case per model runs through its cross-built executable (qwen3-asr, youtu-vl:
token ids; seedvr2: frames) to the package's expected values.

Why: a second platform is where layout and ISA-path bugs show (ARM runs other kernels than x86),
so the packages must verify there, with a build whose cache key cannot collide with the host's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import time
from pathlib import Path
from types import ModuleType

import pytest

from tests.cpp.make_targets import run_make

ROOT = Path(__file__).resolve().parents[2]
CPP = ROOT / "runtime" / "cpp"
AARCH64_EXE = ROOT / "build" / "cpp-aarch64" / "ncnnport-cpp"
MODELS = ("qwen3-asr", "youtu-vl", "seedvr2")
EM_AARCH64 = 183  # ELF e_machine of AArch64


def build_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_ncnn", CPP / "build_ncnn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------
# options and cache key (fast)


def test_host_options_have_no_target_keys_so_host_cache_names_stay():
    b = build_script()
    host = b.build_options(["Input"], False, "avx2")
    assert host == b.build_options(["Input"], False, "avx2", "host")
    assert "target" not in host and "-aarch64-" not in b.install_dir(host).name


def test_aarch64_options_name_the_toolchain_and_drop_the_int8_and_sve_copies():
    b = build_script()
    opts = b.build_options(["Input"], False, "armv82", "aarch64")
    toolchain = CPP / "toolchains" / "aarch64-linux-gnu.cmake"
    assert f"-DCMAKE_TOOLCHAIN_FILE={toolchain}" in b.configure_args(opts)
    assert opts["toolchain_sha256"] == b.sha256_of(toolchain)
    # the cache key holds the toolchain's content, not this checkout's path (CI clones afresh)
    assert str(CPP) not in json.dumps(opts)
    off = {a for a in opts["cmake_args"] if a.endswith("=OFF")}
    assert {"-DNCNN_ARM82DOT=OFF", "-DNCNN_ARM84I8MM=OFF", "-DNCNN_ARM86SVE=OFF"} <= off
    assert "-DNCNN_ARM82=OFF" not in off  # the fp16 (asimdhp) copy stays
    assert not any(a.startswith("-DNCNN_AVX") for a in opts["cmake_args"])  # no x86 ISA options
    name = b.install_dir(opts).name
    assert name.startswith(f"ncnn-{b.NCNN_VERSION}-aarch64-")
    assert name != b.install_dir(b.build_options(["Input"], False, "all", "aarch64")).name


def test_isa_must_belong_to_the_target():
    b = build_script()
    with pytest.raises(b.BuildError, match="for target aarch64"):
        b.build_options(["Input"], False, "avx2", "aarch64")
    with pytest.raises(b.BuildError, match="for target host"):
        b.build_options(["Input"], False, "armv82", "host")


def test_aarch64_apt_adds_the_architecture_before_its_dev_packages(monkeypatch):
    b = build_script()
    calls = []
    monkeypatch.setattr(b, "missing_apt_packages", lambda pkgs: [p for p in pkgs if p.endswith(":arm64")])
    monkeypatch.setattr(b.os, "geteuid", lambda: 0)
    monkeypatch.setattr(b.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(b.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    b.ensure_apt_packages("aarch64")
    assert calls[0] == ["dpkg", "--add-architecture", "arm64"]
    assert calls[-1][:4] == ["apt-get", "install", "-y", "-qq"]
    assert {"libssl-dev:arm64", "libicu-dev:arm64", "libpcre2-dev:arm64", "libzip-dev:arm64"} <= set(calls[-1])


def test_cli_prints_the_toolchain_and_a_target_prefix(capsys):
    b = build_script()
    assert b.main(["--target", "aarch64", "--print-toolchain"]) == 0
    assert capsys.readouterr().out.strip() == str(CPP / "toolchains" / "aarch64-linux-gnu.cmake")
    assert b.main(["--target", "aarch64", "--no-apt", "--print-prefix"]) == 0
    assert "-aarch64-" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# cross build + verify under qemu (slow: a cold cross build of ncnn takes many minutes)


def elf_machine(path: Path) -> int:
    head = path.read_bytes()[:20]
    assert head[:4] == b"\x7fELF", f"{path} is not an ELF file"
    return struct.unpack_from("<H", head, 18)[0]


@pytest.fixture(scope="session")
def aarch64_verify() -> tuple[subprocess.CompletedProcess, float]:
    """`make cpp-aarch64-verify` once: (result, seconds)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    if os.geteuid() != 0 and not (shutil.which("aarch64-linux-gnu-g++") and shutil.which("qemu-aarch64")):
        pytest.skip("needs g++-aarch64-linux-gnu and qemu-user (or root to install them)")
    start = time.monotonic()
    res = run_make("cpp-aarch64-verify")
    return res, time.monotonic() - start


@pytest.mark.slow
def test_make_cpp_aarch64_verify_passes_every_tiny_package(aarch64_verify):
    res, seconds = aarch64_verify
    assert res.returncode == 0, f"{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    assert elf_machine(AARCH64_EXE) == EM_AARCH64
    tables = re.findall(r"^## verify build/(\S+)/tiny/package .*?^(\d+) passed, (\d+) failed$", res.stdout,
                        flags=re.M | re.S)
    assert sorted(m for m, _, _ in tables) == sorted(MODELS)
    assert all(int(failed) == 0 and int(passed) > 1 for _, passed, failed in tables)
    print(f"make cpp-aarch64-verify: {seconds:.0f} s")


E2E_MODELS = ("qwen3-asr", "youtu-vl", "seedvr2")  # the models with a C++ executable and cpp_package_argv


@pytest.mark.slow
def test_make_cpp_aarch64_verify_runs_one_e2e_case_per_model_under_qemu(aarch64_verify):
    """Each executable ran one packaged case under qemu-aarch64 and matched the expected tokens /
    frames; a model without an executable says so in one line instead of failing."""
    from ncnnport.registry import get_port

    res, _ = aarch64_verify
    assert res.returncode == 0, f"{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    runs = re.findall(r"^## cpp e2e (\S+) build/\S+/tiny/package case (\S+) under qemu-aarch64: ([\d.]+) s\n"
                      r"(.*?)^(\d+) passed, (\d+) failed$", res.stdout, flags=re.M | re.S)
    assert sorted(m for m, *_ in runs) == sorted(m for m in MODELS if get_port(m).cpp_executable)
    assert set(E2E_MODELS) <= {m for m, *_ in runs}
    for model, case, seconds, table, passed, failed in runs:
        assert int(failed) == 0 and int(passed) >= 1, table
        stage = "frames" if model == "seedvr2" else "tokens"
        assert f"| {case} | {stage} (cpp vs package expected) | PASS |" in table or f"| {case}[0] | {stage}" in table
        print(f"qemu e2e {model} ({case}): {float(seconds):.1f} s")
    for model in MODELS:
        if not get_port(model).cpp_executable:
            assert f"cpp e2e {model}: skipped (the model has no C++ executable)" in res.stdout


@pytest.mark.slow
def test_aarch64_verify_fails_a_perturbed_weight(aarch64_verify, tmp_path):
    """The Arm run judges: a changed weight (manifest re-hashed) fails there too, naming the graph."""
    import hashlib
    import json

    res, _ = aarch64_verify
    assert res.returncode == 0
    pkg = Path(shutil.copytree(ROOT / "build" / "qwen3-asr" / "tiny" / "package", tmp_path / "pkg"))
    rel = "ncnn/lm_head.ncnn.bin"
    data = bytearray((pkg / rel).read_bytes())
    at = (len(data) // 2) & ~3
    struct.pack_into("<f", data, at, struct.unpack_from("<f", data, at)[0] + 8.0)
    (pkg / rel).write_bytes(bytes(data))
    manifest = json.loads((pkg / "manifest.json").read_text())
    manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    env = dict(os.environ, QEMU_LD_PREFIX="/usr/aarch64-linux-gnu")
    out = subprocess.run(["qemu-aarch64", str(AARCH64_EXE), "verify", str(pkg)], capture_output=True, text=True,
                         env=env, timeout=900, check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    assert re.search(r"^\| golden \| lm_head\[0\] \| FAIL \|", out.stdout, flags=re.M)
    assert len(re.findall(r"\| FAIL \|", out.stdout)) == 1
