"""``--precision`` of the C++ executables (ncnnport/precision.h) against runtime/precision.py.

Why these tests: a precision name must mean the same ncnn flags and the same judging mode in the
Python loop, the C++ loop and bench-cpp. The C++ table is held against ``PRECISIONS`` (every Python
name accepted with equal flags and mode, or refused with a reason, so neither side can add or change
one alone); ``verify --precision fp16-storage`` must judge by the policy's fp16 mode and give the
Python verify's verdict row for row under the same options, and the flag must reach ncnn (the rows'
errors grow); a name the C++ runtime does not run is one line naming the accepted ones, exit 2;
every executable's JSON says which precision ran.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from ncnnport.runtime.precision import NAMES, PRECISION_FIELDS, PRECISIONS
from ncnnport.runtime.precision import get as get_precision
from tests.cpp.verify_table import one_line_exit_2, rows

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("NCNNPORT_CPP_BUILD", ROOT / "build" / "cpp"))
CPP = Path(os.environ.get("NCNNPORT_CPP_EXE", BUILD / "ncnnport-cpp"))
EXECUTABLES = ("ncnnport-qwen3-asr", "ncnnport-youtu-vl", "ncnnport-seedvr2")


@pytest.fixture(scope="module")
def cpp_exe(built_cpp) -> Path:
    return built_cpp(CPP, "NCNNPORT_CPP_EXE")


@pytest.fixture(scope="module")
def build_dir(built_cpp) -> Path:
    return built_cpp(BUILD / "ncnnport-qwen3-asr", "NCNNPORT_CPP_BUILD").parent


def run(*argv: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600, check=False)


def cpp_table(cpp_exe: Path) -> dict:
    res = run(cpp_exe, "precisions")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


# ---------------------------------------------------------------------------------------------
# one vocabulary


def test_the_cpp_table_is_runtime_precision_py(cpp_exe):
    """Accepted names carry exactly Precision.flags (every PRECISION_FIELDS entry),
    Precision.mode and Precision.fp16_kv_cache; accepted + refused is exactly
    runtime/precision.py's vocabulary."""
    table = cpp_table(cpp_exe)
    accepted = {p["name"]: p for p in table["accepted"]}
    assert [p["name"] for p in table["accepted"]][0] == "fp32"
    assert {"fp32", "fp16-storage", "bf16"} <= set(accepted)
    assert set(accepted) | set(table["refused"]) == set(NAMES) and not set(accepted) & set(table["refused"])
    for name, p in accepted.items():
        want = PRECISIONS[name]
        assert p["mode"] == want.mode, name
        assert p["flags"] == {k: bool(want.flags.get(k, False)) for k in PRECISION_FIELDS}, name
        assert p["fp16_kv_cache"] is want.fp16_kv_cache, name
        assert not want.fp16_weights and not want.int8_weights, name  # a package, never an option
    assert all(table["refused"][n] for n in table["refused"])  # each refusal says why


def test_bench_cpp_offers_what_the_executables_accept(cpp_exe):
    from ncnnport.drivers.cpp_bench import CPP_PRECISIONS

    assert list(CPP_PRECISIONS) == [p["name"] for p in cpp_table(cpp_exe)["accepted"]]


# ---------------------------------------------------------------------------------------------
# refusals: one line naming the accepted ones, exit 2


@pytest.mark.parametrize("name", ["fp16", "fp16-packed", "fp16-weights", "FP32"])
def test_verify_refuses_a_precision_it_does_not_run(cpp_exe, package, name):
    line = one_line_exit_2(run(cpp_exe, "verify", package("qwen3-asr"), "--precision", name),
                           f"--precision '{name}'", "accepts fp32, fp16-storage, bf16")
    assert line.startswith("verify: ")
    if name in PRECISIONS:  # a runtime/precision.py name: the reason too
        assert f"({name}: " in line


def test_verify_refuses_a_reduced_precision_on_vulkan(cpp_exe, package):
    one_line_exit_2(run(cpp_exe, "verify", package("qwen3-asr"), "--precision", "fp16-storage", "--vulkan"),
                    "fp16-storage is a CPU setting", "--vulkan runs fp32")


@pytest.mark.parametrize("exe", EXECUTABLES)
def test_every_executable_refuses_an_unknown_precision(build_dir, exe, tmp_path):
    """Before any file is read (the package need not exist), in one line, exit 2; also with
    --verify, and a reduced precision with --vulkan."""
    me = f"{exe}: "
    base = [build_dir / exe, "--package", tmp_path / "nowhere"]
    run_args = {"ncnnport-qwen3-asr": ["--audio", tmp_path / "a.wav"],
                "ncnnport-youtu-vl": ["--prompt", "hi"],
                "ncnnport-seedvr2": ["--input", tmp_path / "i.png", "--output", tmp_path / "o", "--noise", tmp_path / "n.npz"]}
    for extra in (run_args[exe], ["--verify"]):
        if exe == "ncnnport-youtu-vl" and extra == ["--verify"]:
            continue  # no --verify in this executable
        line = one_line_exit_2(run(*base, *extra, "--precision", "int4"), "--precision 'int4'",
                               "accepts fp32, fp16-storage")
        assert line.startswith(me)
    one_line_exit_2(run(*base, *run_args[exe], "--precision", "fp16-storage", "--vulkan"),
                    "fp16-storage is a CPU setting")


# ---------------------------------------------------------------------------------------------
# verify --precision fp16-storage: judged as the Python verify judges, the flag reaching ncnn


def python_rows(pkg: Path, precision: str) -> tuple[str, dict[str, tuple[str, str]]]:
    """The Python verify under ``precision``'s options (``ncnnport verify`` has no --precision:
    its functions with the options ``run --precision`` builds): judged mode and golden rows."""
    from ncnnport.drivers.verify import package_judging_mode, table, verify_package
    from ncnnport.runtime.options import RuntimeOptions
    from ncnnport.runtime.precision import get

    options = get(precision).options(RuntimeOptions(num_threads=1))
    return package_judging_mode(pkg, options), rows(table(verify_package(pkg, options)))


def worst(detail: str) -> float:
    return float(re.fullmatch(r"relative max_abs (\S+)", detail).group(1))


def verified_like_python(cpp_exe: Path, pkg: Path, precision: str, mode: str) -> tuple[dict, dict]:
    """``verify --precision`` on ``pkg``: it passes, its heading names the options and the judging
    mode, and its rows' verdicts are the Python verify's under the same options, row for row.
    Returns (the rows, the same package's fp32 C++ rows) for the caller's per-graph checks."""
    cpp = run(cpp_exe, "verify", pkg, "--precision", precision)
    assert cpp.returncode == 0, cpp.stdout + cpp.stderr
    label = get_precision(precision).options().label.split("/")[0]
    assert cpp.stdout.splitlines()[0] == f"## verify {pkg} ({label}/t1; judged as {mode}; CPU)"
    py_mode, py_rows = python_rows(pkg, precision)
    assert py_mode == mode
    cpp_rows = rows(cpp.stdout)
    assert cpp_rows and {k: v[0] for k, v in cpp_rows.items()} == {k: v[0] for k, v in py_rows.items()}
    assert all(status == "PASS" for status, _ in cpp_rows.values())
    fp32 = rows(run(cpp_exe, "verify", pkg).stdout)
    assert set(fp32) == set(cpp_rows)
    return cpp_rows, fp32


def test_fp16_storage_verify_passes_judged_as_fp16_like_the_python_verify(cpp_exe, package):
    pkg = package("qwen3-asr")
    cpp_rows, fp32 = verified_like_python(cpp_exe, pkg, "fp16-storage", "fp16")
    # the flag reached ncnn, and only its InnerProducts (on x86 the one layer that reads fp16
    # weights; Gemm, Convolution, Embed and the blobs stay fp32): against the C++ fp32 verify of
    # the same package, a graph with an InnerProduct errs > 10x more, any other is unchanged
    with_ip = {p.name.split(".")[0] for p in (pkg / "ncnn").glob("*.ncnn.param")
               if ".gpu." not in p.name and "\nInnerProduct " in p.read_text()}
    assert {"lm_head", "decode_layer0"} <= with_ip and "prefill_layer0" not in with_ip
    for name, (_, detail) in cpp_rows.items():
        if name.split("[")[0] in with_ip:
            assert worst(detail) > 10 * worst(fp32[name][1]), (name, detail, fp32[name])
        else:
            assert detail == fp32[name][1], (name, detail, fp32[name])


def test_fp16_storage_verify_fails_what_the_fp16_budget_fails(cpp_exe, package, tmp_path):
    """The fp16 budget is the policy's: a roundoff rule that gives decode_layer0 no amplification
    (its fp16 budget falls to the fp32 gate) fails that graph's rows under --precision
    fp16-storage, as the Python verify fails them, while the fp32 verify still passes."""
    import shutil

    from tests.cpp.test_cpp_verify import rehash

    pkg = Path(shutil.copytree(package("qwen3-asr"), tmp_path / "pkg"))
    policy = json.loads((pkg / "policy.json").read_text())
    policy["roundoff_rule"].setdefault("modules", {})["decode_layer0"] = {"kappa_abs": 1e-6, "kappa_cos": 1e-6}
    (pkg / "policy.json").write_text(json.dumps(policy))
    rehash(pkg, "policy.json")
    got = run(cpp_exe, "verify", pkg, "--precision", "fp16-storage")
    assert got.returncode == 1, got.stdout + got.stderr
    failed = sorted(k for k, v in rows(got.stdout).items() if v[0] == "FAIL")
    assert failed and all(k.startswith("decode_layer0[") for k in failed), failed
    _, py_rows = python_rows(pkg, "fp16-storage")
    assert {k: v[0] for k, v in rows(got.stdout).items()} == {k: v[0] for k, v in py_rows.items()}
    assert run(cpp_exe, "verify", pkg).returncode == 0


def test_fp16_storage_on_a_derived_package_is_judged_in_its_weights_precision(cpp_exe):
    """As drivers/verify.judging_mode: a package's own weight precision wins over the run's flags
    (Python allows fp16 storage on top of such a package; so does the C++ verify)."""
    from tests.cpp.packages import tiny_precision_package

    pkg = tiny_precision_package("qwen3-asr", "fp16-weights")
    cpp = run(cpp_exe, "verify", pkg, "--precision", "fp16-storage")
    assert "(fp16_storage/t1; judged as fp16_weights; CPU)" in cpp.stdout.splitlines()[0], cpp.stdout + cpp.stderr
    mode, py_rows = python_rows(pkg, "fp16-storage")
    assert mode == "fp16_weights"
    assert {k: v[0] for k, v in rows(cpp.stdout).items()} == {k: v[0] for k, v in py_rows.items()}
    assert cpp.returncode == (0 if all(v[0] == "PASS" for v in py_rows.values()) else 1)


def test_bf16_verify_is_judged_as_bf16_like_the_python_verify(cpp_exe, package):
    """bf16 storage rounds the blobs and weights of every layer with a bf16 path (ncnn casts at
    the boundaries and at extract): judged by the policy's bf16 mode, row for row as the Python
    verify under the same options, and every graph with a matrix layer errs > 10x more than in
    the fp32 verify (the flag reached ncnn)."""
    pkg = package("qwen3-asr")
    cpp_rows, fp32 = verified_like_python(cpp_exe, pkg, "bf16", "bf16")
    # ncnn's x86 Embed has no bf16 path: the embedding graph alone stays bitwise fp32
    embed_only = {p.name.split(".")[0] for p in (pkg / "ncnn").glob("*.ncnn.param")
                  if ".gpu." not in p.name and "\nEmbed " in p.read_text()
                  and not any(f"\n{t} " in p.read_text() for t in ("Gemm", "InnerProduct", "Convolution"))}
    assert embed_only == {"embed"}
    for name, (_, detail) in cpp_rows.items():
        if name.split("[")[0] in embed_only:
            assert detail == fp32[name][1], (name, detail, fp32[name])
        else:
            assert worst(detail) > 10 * worst(fp32[name][1]), (name, detail, fp32[name])


# ---------------------------------------------------------------------------------------------
# a run records its precision; C++ and Python agree token for token under it


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "fp16-storage", "bf16"])
def test_qwen3_asr_run_records_its_precision_and_equals_the_python_loop(build_dir, package, precision, tmp_path):
    """The executable's ids equal the Python wheel's loop under each precision. Under bf16 that
    holds because this build has ncnn's AVX512BF16 copies, as the wheel does: the build without
    them parted from the wheel at token 17 of these 40 on an AVX-512 BF16 CPU (the device's Xeon;
    10 of 18 golden rows' errors differed), and gives the same 40 ids here, where no CPU copy
    differs."""
    import soundfile as sf

    from ncnnport.fsutil import read_json
    from ncnnport.models.qwen3_asr import packaged
    from ncnnport.models.qwen3_asr.audio import read_audio
    from ncnnport.models.qwen3_asr.fixtures import synth_speechlike
    from ncnnport.runtime.lazy_modules import LazyModules
    from ncnnport.runtime.options import RuntimeOptions
    from ncnnport.runtime.precision import get

    pkg = package("qwen3-asr")
    audio = tmp_path / "a.wav"
    sf.write(str(audio), synth_speechlike(3.0, seed=5), 16000, subtype="FLOAT")
    out = tmp_path / "o.json"
    extra = [] if precision == "fp32" else ["--precision", precision]
    res = run(build_dir / "ncnnport-qwen3-asr", "--package", pkg, "--audio", audio, "--max-new-tokens", "40",
              "--json-out", out, *extra)
    assert res.returncode == 0, res.stderr
    got = json.loads(out.read_text())
    assert got["timing"]["precision"] == precision
    # read back from the nets the run opened (not the table): the flags reached every graph
    assert got["timing"]["precision_flags"] == {k: bool(get(precision).flags.get(k, False)) for k in PRECISION_FIELDS}
    if got["timing"]["gemv"].startswith("ncnnport-") and precision != "bf16":  # the overwrite ran (it reads
        assert got["timing"]["gemv_calls"] > 0  # fp16 weights under fp16 storage; it steps aside under bf16)
    # fp16 K/V rows under fp16-storage, stored in 2 bytes where the decode MatMul overwrite reads them
    rows = "fp16" if get(precision).fp16_kv_cache else "fp32"
    assert got["timing"]["kv_cache_rows"] == rows
    two_bytes = rows == "fp16" and got["timing"]["matmul"].startswith("ncnnport-")
    assert got["timing"]["kv_cache_value_bytes"] == (2 if two_bytes else 4)
    options = get(precision).options(RuntimeOptions(num_threads=1))
    asr = packaged.open_packaged(pkg, read_json(pkg / "model.json"), LazyModules(pkg, options=options))
    assert asr.pipeline.new_cache(4).row_format == rows
    want = packaged.transcribe(asr, read_audio(audio), max_new_tokens=40)
    assert [c["token_ids"] for c in got["chunks"]] == want.token_ids


@pytest.mark.slow
def test_qwen3_asr_bf16_over_an_int8_package_keeps_its_fp16_rows_in_four_bytes(build_dir, tmp_path):
    """An int8-weights package's rows are fp16 under any CPU precision, but under bf16 storage ncnn
    casts every 16-bit blob entering its MatMul (no bf16 path on x86) from bf16 to fp32, so fp16
    bits would be misread: the rows stay fp16 values in 4 bytes there (fp16_cache_inputs_active),
    and the run equals the one whose built-in MatMul reads floats (--ncnn-matmul). With 2-byte
    rows the real-L4 package parted from it at token 1."""
    import soundfile as sf

    from ncnnport.models.qwen3_asr.fixtures import synth_speechlike
    from tests.cpp.packages import tiny_precision_package

    pkg = tiny_precision_package("qwen3-asr", "int8-weights")
    audio = tmp_path / "a.wav"
    sf.write(str(audio), synth_speechlike(3.0, seed=5), 16000, subtype="FLOAT")
    runs = {}
    for name, extra in {"ours": [], "builtin": ["--ncnn-matmul"]}.items():
        out = tmp_path / f"{name}.json"
        res = run(build_dir / "ncnnport-qwen3-asr", "--package", pkg, "--audio", audio, "--max-new-tokens", "24",
                  "--precision", "bf16", "--json-out", out, *extra)
        assert res.returncode == 0, res.stderr
        runs[name] = json.loads(out.read_text())
    timing = runs["ours"]["timing"]
    assert timing["precision"] == "bf16" and timing["kv_cache_rows"] == "fp16"
    assert timing["kv_cache_value_bytes"] == 4, timing
    assert [c["token_ids"] for c in runs["ours"]["chunks"]] == [c["token_ids"] for c in runs["builtin"]["chunks"]]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "fp16-storage"])
def test_youtu_vl_run_records_its_precision_and_equals_the_python_loop(build_dir, package, precision, tmp_path):
    """Under fp16 storage the one-token steps run the layers' and head's ``decode`` variants, as
    ``pipeline.decode_runners`` does (on x86 only InnerProduct reads fp16 weights); the prompt the
    base graphs. The run's ``graphs`` say which opened, and its ids equal the Python loop's."""
    from ncnnport.fsutil import read_json
    from ncnnport.models.youtu_vl import packaged
    from ncnnport.models.youtu_vl.pipeline import decode_runners
    from ncnnport.runtime.lazy_modules import LazyModules
    from ncnnport.runtime.options import RuntimeOptions
    from ncnnport.runtime.precision import get

    pkg = package("youtu-vl")
    out = tmp_path / "o.json"
    extra = [] if precision == "fp32" else ["--precision", precision]
    # a prompt whose 24 tiny-preset ids vary, and under fp16 storage part from the ids of a loop
    # that decodes on the base graphs (fp32-weight Gemms) at token 17
    prompt = "What is in this picture? Answer briefly."
    res = run(build_dir / "ncnnport-youtu-vl", "--package", pkg, "--prompt", prompt,
              "--max-new-tokens", "24", "--json-out", out, *extra)
    assert res.returncode == 0, res.stderr
    got = json.loads(out.read_text())
    timing = got["timing"]
    assert timing["precision"] == precision
    assert timing["precision_flags"] == {k: bool(get(precision).flags.get(k, False)) for k in PRECISION_FIELDS}
    layers = [g for g in timing["graphs"] if g.startswith("llm_layer")]
    heads = [g for g in timing["graphs"] if g.startswith("lm_head")]
    if precision == "fp32":  # the base graphs serve the steps too
        assert layers and heads and not any(g.endswith(".decode") for g in timing["graphs"])
    else:  # both: the base graphs for the prompt, the variants for the steps
        assert {g + ".decode" for g in layers + heads if "." not in g} == {g for g in layers + heads if g.endswith(".decode")}
        assert any(g.endswith(".decode") for g in layers) and any(g.endswith(".decode") for g in heads)
        if timing["gemv"].startswith("ncnnport-"):  # the variants' InnerProducts ran on the kernel
            assert timing["gemv_calls"] > 0
            # and their streams are counted inside the layers' graphs, a share of their time
            assert 0 < timing["decode_layers_stream_s"] < timing["decode_layers_s"], timing
    if precision == "fp32":  # the base graphs' Gemms stream nothing through the one-row kernels
        assert timing["decode_layers_stream_s"] == 0
    options = get(precision).options(RuntimeOptions(num_threads=1))
    model_json = read_json(pkg / "model.json")
    modules = LazyModules(pkg, options=options)
    want = packaged.generate_ids(modules, packaged.packaged_config(pkg, model_json),
                                 packaged.packaged_tokenizer(pkg, model_json), prompt, None, 24,
                                 decode_runners=decode_runners(modules))
    assert got["chunks"][0]["token_ids"] == want
    assert len(set(want)) >= 12  # a varied sequence, not one id repeated


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen3-asr", "youtu-vl"])
def test_bf16_runs_every_graph_in_bf16_and_steps_the_kernels_aside(build_dir, package, model, tmp_path):
    """bf16 is the precision that makes the vision encoder fast (docs/performance.md, "Youtu-VL vision at 1024 and the cap"). A
    run under it (Youtu-VL with an image of two unequal windows: every vision segment and the
    merger) reads the bf16 flag back from every net it opened, runs the prompt graphs for the
    steps (no fp16 decode variants), and ncnnport's one-row kernels step aside for ncnn's bf16
    paths. (Its ids against the Python wheel's: the qwen3-asr run test above, under bf16 too.)"""
    from ncnnport.models.youtu_vl.fixtures import synthetic_image

    pkg, out = package(model), tmp_path / "o.json"
    if model == "youtu-vl":
        image = tmp_path / "two_windows.png"
        synthetic_image(180, 270, seed=3).save(image)
        argv = [build_dir / "ncnnport-youtu-vl", "--prompt", "What is in the picture?", "--image", image]
    else:
        import soundfile as sf

        from ncnnport.models.qwen3_asr.fixtures import synth_speechlike

        audio = tmp_path / "a.wav"
        sf.write(str(audio), synth_speechlike(3.0, seed=5), 16000, subtype="FLOAT")
        argv = [build_dir / "ncnnport-qwen3-asr", "--audio", audio]
    res = run(*argv, "--package", pkg, "--max-new-tokens", "16", "--json-out", out, "--precision", "bf16")
    assert res.returncode == 0, res.stderr
    timing = json.loads(out.read_text())["timing"]
    assert timing["precision"] == "bf16"
    assert timing["precision_flags"] == {k: k == "bf16_storage" for k in PRECISION_FIELDS}
    if model == "youtu-vl":  # (the Qwen3-ASR run names no graphs: it has no variants to choose)
        assert not any(g.endswith(".decode") for g in timing["graphs"])
        assert any(g.startswith("vision_seg") for g in timing["graphs"]) and "merger" in timing["graphs"]
    assert timing["gemv_calls"] == 0 and timing["int8_gemv_calls"] == 0  # the keys are always written


@pytest.mark.slow
def test_youtu_vl_fp16_storage_refuses_a_package_without_decode_variants(build_dir, package, tmp_path):
    """A package whose layers and head declare no ``decode`` variant would decode fp16 storage on
    fp32-weight Gemms: refused in one line naming the spec (runtime/variants.with_variant raises
    the same way), while fp32 runs it."""
    pkg = package("youtu-vl")
    copy = tmp_path / "pkg"
    copy.mkdir()
    for entry in pkg.iterdir():
        if entry.name != "specs":
            (copy / entry.name).symlink_to(entry.resolve())
    (copy / "specs").mkdir()
    for spec in (pkg / "specs").iterdir():
        doc = json.loads(spec.read_text())
        doc.pop("variants", None)
        (copy / "specs" / spec.name).write_text(json.dumps(doc))
    argv = [build_dir / "ncnnport-youtu-vl", "--package", copy, "--prompt", "hi", "--max-new-tokens", "2", "--no-check"]
    res = run(*argv, "--precision", "fp16-storage")
    assert res.returncode == 2, res.stderr
    one_line_exit_2(res, "llm_layer0.spec.json", "'decode' variant")
    assert run(*argv).returncode == 0


@pytest.mark.slow
def test_seedvr2_run_records_the_flags_its_graphs_carried(build_dir, package, tmp_path):
    """The image loop too: --precision fp16-storage / bf16 runs a packaged case and its JSON (top
    level) names the precision and the flags its nets carried; fp32 says fp32."""
    from ncnnport.runtime.precision import get

    pkg = package("seedvr2")
    case = sorted(p.parent for p in (pkg / "cases").glob("*/case.json"))[0]
    area = json.loads((case / "case.json").read_text())["args"]["area"]
    for name in ("fp16-storage", "bf16", "fp32"):
        out = tmp_path / name
        res = run(build_dir / "ncnnport-seedvr2", "--package", pkg, "--input", case / "input.png", "--output",
                  out / "frames", "--noise", case / "noise.npz", "--area", str(area), "--json-out", out / "run.json",
                  *(["--precision", name] if name != "fp32" else []))
        assert res.returncode == 0, res.stderr
        assert f"[{get(name).options().label.split('/')[0]}/t1" in res.stdout  # fp16_storage/t1 or fp32/t1
        doc = json.loads((out / "run.json").read_text())
        assert doc["precision"] == name
        assert doc["precision_flags"] == {k: bool(get(name).flags.get(k, False)) for k in PRECISION_FIELDS}
