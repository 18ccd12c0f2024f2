"""``ncnnport parity MODEL --runtime cpp``: the model's C++ executable on the e2e fixtures (and
``--input`` files), judged against the torch-free Python package loop (token ids identical,
first differing position named) and against the torch reference (the usual token rows).

Why: the loop that ships is a hand-written C++ loop; it is proven by the same inputs and gates
as the Python loop. Which executable and which arguments a fixture needs come from the port
(``ModelPort.cpp_executable`` / ``cpp_cases``); nothing here knows a model.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from ncnnport.fsutil import read_json, sha256_file
from ncnnport.package.manifest import tool_versions
from ncnnport.parity.records import token_record
from ncnnport.parity.reproducible import deterministic_reference
from ncnnport.registry import CppCase, E2EContext
from ncnnport.runtime.lazy_modules import LazyModules, LazyTorchModules
from ncnnport.runtime.machine import machine_record
from ncnnport.runtime.options import FP32
from ncnnport.stages import Prepared, log

SUMMARY_SCHEMA = 1
# issue 13: the C++ loop must reproduce >= 128 new tokens on at least one input
MIN_NEW_TOKENS = 128
REPO_ROOT = Path(__file__).resolve().parents[2]
EXECUTABLE_TIMEOUT_S = 1800


class CppRuntimeError(RuntimeError):
    """The C++ side cannot run: no hook, no executable, or the executable failed (one line)."""


def cpp_build_dir() -> Path:
    """Where ``make cpp`` puts the executables (``NCNNPORT_CPP_BUILD`` overrides)."""
    return Path(os.environ.get("NCNNPORT_CPP_BUILD") or REPO_ROOT / "build" / "cpp")


def find_executable(name: str, build: bool = True) -> Path:
    """``build/cpp/NAME``, running ``make cpp`` first when it is missing and a Makefile is here."""
    exe = cpp_build_dir() / name
    if exe.is_file():
        return exe
    makefile = REPO_ROOT / "Makefile"
    if not build or not makefile.is_file() or os.environ.get("NCNNPORT_CPP_BUILD"):
        raise CppRuntimeError(f"{exe} not found; build it with `make -C {REPO_ROOT} cpp`")
    log(f"{exe} missing: running `make cpp` in {REPO_ROOT}")
    done = subprocess.run(["make", "-C", str(REPO_ROOT), "cpp"], capture_output=True, text=True)
    if done.returncode != 0 or not exe.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise CppRuntimeError(f"`make -C {REPO_ROOT} cpp` did not produce {exe}: {tail[0]}")
    return exe


def run_executable(exe: Path, argv: Sequence[str], json_out: Path) -> dict[str, Any]:
    """Run ``exe argv --json-out FILE``; its JSON, or CppRuntimeError with its last stderr line."""
    cmd = [str(exe), *argv, "--json-out", str(json_out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=EXECUTABLE_TIMEOUT_S)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise CppRuntimeError(f"{exe.name} exited {done.returncode}: {last}")
    try:
        out = json.loads(json_out.read_text(encoding="utf-8"))
        tokens = [[int(t) for t in c["token_ids"]] for c in out["chunks"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CppRuntimeError(f"{exe.name}: {json_out} is not a result with chunks[].token_ids ({exc})") from None
    return {**out, "token_ids": tokens}


def sequence_records(case: CppCase, cpp_tokens: list[list[int]]) -> list[dict[str, Any]]:
    """Per chunk: C++ vs the Python package loop (identical ids) and C++ vs the torch reference."""
    records = []
    n = max(len(cpp_tokens), len(case.python_tokens), len(case.reference_tokens))
    for i in range(n):
        label = case.fixture if n == 1 else f"{case.fixture}[{i}]"
        cpp = cpp_tokens[i] if i < len(cpp_tokens) else []
        python = case.python_tokens[i] if i < len(case.python_tokens) else []
        ref = case.reference_tokens[i] if i < len(case.reference_tokens) else []
        logits = case.reference_logits[i] if case.reference_logits and i < len(case.reference_logits) else None
        records.append(token_record(label, python, cpp, stage="tokens (cpp vs python package loop)",
                                    runtime="cpp"))
        records.append(token_record(label, ref, cpp, logits, stage="tokens (cpp vs torch reference)",
                                    runtime="cpp"))
    if len(cpp_tokens) != len(case.python_tokens):
        records.append({"fixture": case.fixture, "stage": "chunks", "kind": "text", "runtime": "cpp",
                        "passed": False, "gated": True,
                        "reason": f"cpp gave {len(cpp_tokens)} chunks, python {len(case.python_tokens)}"})
    return records


def coverage_record(records: list[dict[str, Any]], minimum: int = MIN_NEW_TOKENS) -> dict[str, Any]:
    """The longest run of identical C++ / reference tokens must reach ``minimum`` somewhere."""
    rows = [r for r in records if r.get("stage") == "tokens (cpp vs torch reference)"]
    best = max((r["tokens_matched"] for r in rows), default=0)
    return {"fixture": "*", "stage": "tokens coverage (cpp)", "kind": "text", "runtime": "cpp", "gated": True,
            "longest_identical": best, "passed": best >= minimum,
            "reason": "" if best >= minimum else f"longest identical sequence {best} tokens, gate needs {minimum}"}


def run_cpp_parity(prep: Prepared, package: Path, user_inputs: Sequence[Path] = (),
                   max_new_tokens: int = MIN_NEW_TOKENS) -> dict[str, Any]:
    """The summary (schema of ``drivers.parity.run_parity``) of the C++ runtime's e2e rows."""
    t, port = prep.target, prep.port
    if not port.cpp_executable:
        raise CppRuntimeError(f"model {t.model} has no C++ runtime (its port sets no cpp_executable)")
    exe = find_executable(port.cpp_executable)
    ctx = E2EContext(loaded=prep.loaded, ncnn_modules=LazyModules(package, options=FP32),
                     torch_modules=LazyTorchModules(prep.specs), package_dir=package, policy=prep.policy,
                     user_inputs=list(user_inputs))
    t0 = time.perf_counter()
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ncnnport-cpp-") as tmp, deterministic_reference() as reference:
        log(f"{t.model}: python package loop + torch reference on every fixture")
        cases = port.cpp_cases(ctx, Path(tmp), max_new_tokens)
        for case in cases:
            log(f"{t.model}: {exe.name} on {case.fixture}")
            t1 = time.perf_counter()
            out = run_executable(exe, case.argv, Path(tmp) / "out.json")
            seq = sequence_records(case, out["token_ids"])
            for r in seq:
                r["cpp_seconds"] = round(time.perf_counter() - t1, 3)
                r["cpp_timing"] = out.get("timing")
            records += seq
            if case.python_text is not None and "text" in out:
                same = out["text"] == case.python_text
                records.append({"fixture": case.fixture, "stage": "transcript (cpp vs python)", "kind": "text",
                                "runtime": "cpp", "gated": True, "passed": same,
                                "reason": "" if same else "texts differ"})
    records.append(coverage_record(records))
    manifest = read_json(package / "manifest.json")
    return {
        "schema": SUMMARY_SCHEMA, "model": t.model, "runtime": "cpp", "executable": str(exe),
        "preset": t.preset if t.ckpt is None else None, "ckpt": str(Path(t.ckpt).name) if t.ckpt else None,
        "precision": "fp32", "runtime_options": FP32.to_json(),
        "gates_passed": bool(records) and all(r["passed"] for r in records),
        "policy": prep.policy.describe(), "modules": [], "e2e": records,
        "versions": tool_versions(), "machine": machine_record(), "reference": reference,
        "manifest_sha256": sha256_file(package / "manifest.json"), "build_key": manifest["build_key"],
        "memory": manifest.get("memory"),
        "timings_s": {**{k: round(v, 2) for k, v in prep.timings.items()},
                      "cpp_e2e_s": round(time.perf_counter() - t0, 2)},
    }
