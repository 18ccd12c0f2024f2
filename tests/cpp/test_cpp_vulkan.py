"""The C++ runtime on Vulkan (`make cpp VULKAN=1`, build/cpp-vulkan), on lavapipe in CI.

Why these tests: `--vulkan` is a flag of every executable, and a deployer reads the C++ verify's
table as the verdict on the device. So on a Vulkan device
* `ncnnport-cpp verify PKG --vulkan` must judge every golden row by the packaged policy's
  `vulkan_fp32` budgets and agree row by row with `ncnnport verify --backend vulkan`;
* each model's packaged e2e case must pass through its executable with `--vulkan`, with glibc's
  heap checks on (MALLOC_CHECK_=3), several times: the decoders feed ncnn cache views, whose
  upload once overflowed ncnn's staging buffer;
* a cache view fed to a graph must give the numbers a compact copy gives (ncnnport-view-check).
The Vulkan build is used when build/cpp-vulkan/ncnnport-cpp exists (brought up to date by `make
cpp VULKAN=1`, incremental) or built from cold when NCNNPORT_CPP_VULKAN=1 (CI does not: ncnn with
Vulkan from a cold cache is the expensive build runtime/cpp/README.md measures); else skipped.
The gate derivation itself (`ncnnport-cpp gates`) needs no device and runs on the CPU build.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cpp.make_targets import ROOT, make_cpp

VULKAN_DIR = ROOT / "build" / "cpp-vulkan"
CPU_EXE = ROOT / "build" / "cpp" / "ncnnport-cpp"
MODELS = ("qwen3-asr", "youtu-vl", "seedvr2")
# graphs with a 3-D (rank-4 spec) input that the decoders feed as KV cache views
VIEW_GRAPHS = {"qwen3-asr": "decode_layer0", "youtu-vl": "llm_layer0"}
POLICY_MODES = ("fp32", "vulkan_fp32", "vulkan_fp16", "bf16", "fp16_arithmetic", "fp16_weights", "int8_weights")
HEAP_REPEATS = 3


def _vulkan_device() -> bool:
    from ncnnport.drivers.bench import vulkan_available

    return vulkan_available()


needs_vulkan = pytest.mark.skipif(not _vulkan_device(), reason="no Vulkan device on this machine")


@pytest.fixture(scope="session")
def vulkan_build() -> Path:
    """build/cpp-vulkan, brought up to date (or built, with NCNNPORT_CPP_VULKAN=1); a skip otherwise."""
    exe = VULKAN_DIR / "ncnnport-cpp"
    if os.environ.get("NCNNPORT_CPP_VULKAN") != "1" and not exe.is_file():
        pytest.skip(f"{exe} not built and NCNNPORT_CPP_VULKAN is not 1 (the cold ncnn+Vulkan build is not run "
                    "by default: make cpp VULKAN=1)")
    make_cpp(vulkan=True)
    assert exe.is_file(), f"{exe} was not built"
    return VULKAN_DIR


def _run(cmd: list[str], env: dict[str, str] | None = None, timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, check=False,
                          env=None if env is None else {**os.environ, **env})


def golden_rows(table: str) -> dict[str, str]:
    """``name -> PASS/FAIL`` of the golden rows of a verify table."""
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] == "golden":
            rows[cells[1]] = cells[2]
    return rows


# ---------------------------------------------------------------------------------------------
# gates: the policy rows the C++ verify judges Vulkan by (CPU build, no device needed)

def _cpp_gates(policy: Path, mode: str, module: str) -> dict[str, dict[str, float]]:
    res = _run([CPU_EXE, "gates", policy, mode, module])
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _py_gates(policy: Path, mode: str, module: str) -> dict[str, dict[str, float]]:
    from dataclasses import asdict

    from ncnnport.parity.policy import Policy

    return {k: asdict(v) for k, v in Policy.load(policy).module(module, mode).items()}


def _synthetic_policies(tmp: Path) -> list[Path]:
    """A policy with a roundoff rule and a module's own kappa, and one that states its gates as
    numbers (mode default, a module's "*" and a per-output override)."""
    ruled = {"version": 1, "precisions": {"fp32": {"default": {"min_cosine": 0.99999, "max_abs_rel": 2e-4}},
                                          "vulkan_fp32": {"stages": {"frames": {"max_abs_rel": 0.0, "max_abs_floor": 2}}}},
             "roundoff_rule": {"kappa_abs": 7, "kappa_cos": 13, "margin": 3.0, "accumulation_length": 4,
                               "vulkan_accumulation_length": 256, "modules": {"enc": {"kappa_cos": 90}},
                               "propagated": {"kappa_abs": 40, "kappa_cos": 60, "modules": {"enc": {"kappa_cos": 200}}}}}
    stated = {"version": 2, "precisions": {
        "fp32": {"default": {"max_abs_floor": 1e-5}},
        "fp16": {"default": {"min_cosine": 0.999, "max_abs_rel": 3e-2}},
        "vulkan_fp32": {"default": {"min_cosine": 0.99995, "max_abs_rel": 1e-3},
                        "modules": {"enc": {"*": {"max_abs_rel": 5e-3}, "logits": {"min_cosine": 0.9999}}}}}}
    out = []
    for name, doc in (("ruled", ruled), ("stated", stated)):
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(doc))
        out.append(path)
    return out


@pytest.mark.slow
def test_cpp_gates_are_the_python_policy_gates(built_cpp, tmp_path):
    """Every module of every model's policy, and two synthetic policies, in every mode: the C++
    gates are the same doubles as Policy.module's (the rows `verify --vulkan` judges by)."""
    built_cpp(CPU_EXE, "NCNNPORT_CPP_EXE")
    cases = [(ROOT / "models" / m / "policy.json", mod)
             for m, mods in (("qwen3_asr", ("decode_layer0", "encoder")), ("youtu_vl", ("vision", "decode_layer0")),
                             ("seedvr2", ("vae_encode", "vae_decode_3", "dit_input")))
             for mod in mods]
    cases += [(p, mod) for p in _synthetic_policies(tmp_path) for mod in ("enc", "other")]
    for policy, module in cases:
        for mode in POLICY_MODES:
            assert _cpp_gates(policy, mode, module) == _py_gates(policy, mode, module), (policy, mode, module)


@pytest.mark.slow
def test_cpp_gates_refuse_a_bad_policy_in_one_line(built_cpp, tmp_path):
    built_cpp(CPU_EXE, "NCNNPORT_CPP_EXE")
    bad = tmp_path / "policy.json"
    bad.write_text(json.dumps({"version": 1, "precisions": {"vulkan_fp32": {"default": {}}},
                               "roundoff_rule": {"kappa_abs": 3, "kappa_cos": 4}}))
    res = _run([CPU_EXE, "gates", bad, "vulkan_fp32", "m"])
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert str(bad) in res.stderr and "precisions.vulkan_fp32" in res.stderr
    # a malformed propagated amplification is refused as Policy.load refuses it
    for propagated in ({"kappa_abs": 0}, {"margin": 3}, [], {"kappa_cos": "9"}, {"modules": []},
                       {"modules": {"m": {}}}, {"modules": {"m": {"kappa_cos": 0}}}):
        bad.write_text(json.dumps({"version": 1, "precisions": {"fp32": {}},
                                   "roundoff_rule": {"kappa_abs": 3, "kappa_cos": 4, "propagated": propagated}}))
        res = _run([CPU_EXE, "gates", bad, "bf16", "m"])
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, (propagated, res.stderr)
        assert "roundoff_rule.propagated" in res.stderr, res.stderr


# ---------------------------------------------------------------------------------------------
# on the Vulkan device

@pytest.mark.slow
@pytest.mark.gpu
@needs_vulkan
@pytest.mark.parametrize("model", MODELS)
def test_verify_vulkan_agrees_with_python_verify(model, vulkan_build, package):
    pkg = package(model)
    cpp = _run([vulkan_build / "ncnnport-cpp", "verify", pkg, "--vulkan"])
    assert cpp.returncode == 0, cpp.stdout[-3000:] + cpp.stderr[-2000:]
    assert "judged as vulkan_fp32" in cpp.stdout and "Vulkan:" in cpp.stdout
    py = _run([sys.executable, "-m", "ncnnport.cli", "verify", pkg, "--backend", "vulkan"])
    assert py.returncode == 0, py.stdout[-3000:] + py.stderr[-2000:]
    heading = re.compile(r"^## verify \S+ \((.*)\)$", re.M)
    assert heading.search(cpp.stdout).group(1) == heading.search(py.stdout).group(1)  # options, mode, device
    assert golden_rows(cpp.stdout) == golden_rows(py.stdout)


@pytest.mark.slow
@pytest.mark.gpu
@needs_vulkan
@pytest.mark.parametrize("model", MODELS)
def test_e2e_case_on_vulkan_under_heap_checks(model, vulkan_build, package):
    pkg = package(model)
    for _ in range(HEAP_REPEATS if model in VIEW_GRAPHS else 1):
        res = _run([sys.executable, "-m", "ncnnport.drivers.cpp_package_cases", model, pkg,
                    "--exe-dir", vulkan_build, "--vulkan"], env={"MALLOC_CHECK_": "3"})
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        assert "on Vulkan" in res.stdout and "0 failed" in res.stdout


def _asr_ids(exe: Path, pkg: Path, tmp: Path, *flags: str) -> tuple[list[int], str]:
    out = tmp / f"asr{len(list(tmp.iterdir()))}.json"
    res = _run([str(exe), "--package", str(pkg), "--audio", str(pkg / "cases" / "speech_5s_english" / "input.wav"),
                "--max-new-tokens", "140", "--json-out", str(out), *flags], env={"MALLOC_CHECK_": "3"})
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads(out.read_text())
    return result["chunks"][0]["token_ids"], result["timing"]["kv_cache"]


@pytest.mark.slow
@pytest.mark.gpu
@needs_vulkan
def test_qwen3_asr_decode_with_the_cache_on_the_gpu_reproduces_the_cpu_tokens(vulkan_build, package, tmp_path):
    """--vulkan decodes over a device-resident cache through the decode layers' gpu variant (one
    command per token, the cache never downloaded); 140 new tokens equal the CPU run's, as does
    --host-kv (the host cache uploaded every call)."""
    exe, pkg = vulkan_build / "ncnnport-qwen3-asr", package("qwen3-asr")
    cpu, kind = _asr_ids(exe, pkg, tmp_path)
    assert kind == "host" and len(cpu) == 140
    assert _asr_ids(exe, pkg, tmp_path, "--vulkan") == (cpu, "gpu")
    assert _asr_ids(exe, pkg, tmp_path, "--vulkan", "--host-kv") == (cpu, "host")
    res = _run([str(exe), "--package", str(pkg), "--audio", "x.wav", "--host-kv"])
    assert res.returncode == 2 and "--host-kv chooses the Vulkan decode's cache: it needs --vulkan" in res.stderr


@pytest.mark.slow
@pytest.mark.gpu
@needs_vulkan
@pytest.mark.parametrize("model", sorted(VIEW_GRAPHS))
def test_cache_view_on_vulkan_gives_the_compact_numbers(model, vulkan_build, package):
    """A [heads, past, head_dim] input fed as a view into a larger buffer (NaN in the spare rows),
    as KvCache hands it over, computes bit for bit what a compact copy computes on Vulkan."""
    res = _run([vulkan_build / "ncnnport-view-check", package(model), VIEW_GRAPHS[model], "--vulkan", "--spare", "7"],
               env={"MALLOC_CHECK_": "3"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "(vulkan)" in res.stdout and re.search(r"output \S+: 0 of \d+ values differ", res.stdout)


# ---------------------------------------------------------------------------------------------
# bundle.py: the executables with their non-system libraries (tested on the CPU build)

def _bundle_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("ncnnport_cpp_bundle", ROOT / "runtime" / "cpp" / "bundle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bundle_leaves_glibc_libstdcxx_libgcc_and_libvulkan_to_the_target():
    bundle = _bundle_module()
    for soname in ("libc.so.6", "libm.so.6", "libpthread.so.0", "libmvec.so.1", "libstdc++.so.6", "libgcc_s.so.1",
                   "libvulkan.so.1", "ld-linux-x86-64.so.2"):
        assert bundle.is_system_lib(soname), soname
    for soname in ("libzip.so.4", "libicuuc.so.72", "libgomp.so.1", "libcrypto.so.3", "libz.so.1"):
        assert not bundle.is_system_lib(soname), soname


def test_bundle_archive_holds_the_folder(tmp_path):
    bundle = _bundle_module()
    out = tmp_path / "b"
    (out / "lib").mkdir(parents=True)
    (out / "lib" / "libx.so.1").write_bytes(b"x" * 100)
    packed = bundle.archive(out)
    import tarfile

    with tarfile.open(packed) as tar:
        assert sorted(tar.getnames()) == ["b", "b/lib", "b/lib/libx.so.1"]


@pytest.mark.slow
def test_bundle_runs_with_its_own_libraries(built_cpp, tmp_path):
    """A bundle of build/cpp: ncnnport-cpp runs from it with LD_LIBRARY_PATH alone, and every
    library ldd then resolves outside glibc/libstdc++/libgcc/libvulkan comes from the bundle."""
    built_cpp(CPU_EXE, "NCNNPORT_CPP_EXE")
    out = tmp_path / "bundle"
    res = _run([sys.executable, ROOT / "runtime" / "cpp" / "bundle.py", CPU_EXE.parent, out, "--exe", "ncnnport-cpp"])
    assert res.returncode == 0, res.stderr
    assert re.search(r"total \d+ bytes \(\d+\.\d MiB\)", res.stdout)
    assert [p.name for p in (out / "bin").iterdir()] == ["ncnnport-cpp"]
    libs = {p.name for p in (out / "lib").iterdir()}
    assert "libzip.so.4" in libs and not {"libc.so.6", "libstdc++.so.6", "libgcc_s.so.1"} & libs
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(out / "lib")}
    version = subprocess.run([out / "bin" / "ncnnport-cpp", "version"], capture_output=True, text=True, env=env)
    assert version.returncode == 0 and version.stdout.startswith("ncnn 1.0."), version.stderr
    assert _run([out / "run", "ncnnport-cpp", "version"]).stdout == version.stdout
    ldd = subprocess.run(["ldd", out / "bin" / "ncnnport-cpp"], capture_output=True, text=True, env=env).stdout
    resolved = dict(re.findall(r"^\s*(\S+) => (\S+)", ldd, flags=re.M))
    bundled = {name: path for name, path in resolved.items() if name in libs}
    assert bundled and all(Path(p).parent == out / "lib" for p in bundled.values()), ldd
    assert set(resolved) - set(bundled) <= {n for n in resolved if _bundle_module().is_system_lib(n)}


@pytest.mark.slow
def test_bundle_over_the_limit_is_one_line(built_cpp, tmp_path):
    built_cpp(CPU_EXE, "NCNNPORT_CPP_EXE")
    res = _run([sys.executable, ROOT / "runtime" / "cpp" / "bundle.py", CPU_EXE.parent, tmp_path / "b",
                "--exe", "ncnnport-cpp", "--max-mib", "1"])
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1 and "over the 1 MiB limit" in res.stderr
