"""A package's e2e cases through the model's C++ executable, judged against the package's own
expected values (no reference model is built or run: the case holds its results), and the
executable may run under a launcher (``qemu-aarch64``).

Why: ``make cpp-aarch64-verify`` proves the golden vectors on the Arm code paths, but the loop
around the graphs (audio, prompt, KV cache, windows, Euler step, colour fix) runs there too, so
one whole case per model must give the reference's tokens or frames on that platform as well.
Which arguments a case needs comes from the port (``ModelPort.cpp_package_argv``); the judgement
is generic: token ids identical to ``expected.token_ids``; frames byte-identical to
``expected.frames_sha256``, else the packaged policy's frames gate against ``expected.png``
(its ``vulkan_fp32`` row with ``--vulkan``, which the executable is then run with).

    python -m ncnnport.drivers.cpp_package_cases MODEL PACKAGE --exe-dir DIR [--launcher CMD] [--case NAME] [--vulkan]

Exit 0 every row passes (or the model has no C++ executable: one "skipped" line), 1 a row
failed, 2 the case cannot be run (one line naming what).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ncnnport.drivers.cpp_parity import (CppRuntimeError, frame_record, frames_of, frames_sha256, run_executable,
                                         token_ids_of)
from ncnnport.parity.records import token_record

FRAMES_POLICY_STAGE = "frames"  # the policy stage that gates uint8 frame outputs


def smallest_case(cases: Sequence[Any]) -> Any:
    """The case with the fewest input bytes (the cheapest under an emulator) among those with an
    input file (a case without one, e.g. a text-only prompt, skips the model's input stages);
    ties by name."""
    if not cases:
        raise CppRuntimeError("the package has no e2e cases (cases/*/case.json)")
    with_inputs = [c for c in cases if c.inputs] or list(cases)
    return min(with_inputs, key=lambda c: (sum(p.stat().st_size for p in c.inputs.values()), c.name))


def expected_sequences(expected: Any) -> list[list[int]]:
    """``expected.token_ids`` as sequences: per chunk (a list of lists) or one flat sequence."""
    if expected and all(isinstance(t, int) for t in expected):
        return [[int(t) for t in expected]]
    return [[int(t) for t in chunk] for chunk in expected]


def run_case(launcher: Sequence[str], exe: Path, argv: Sequence[str], json_out: Path) -> tuple[dict[str, Any], float]:
    """``launcher exe argv --json-out FILE``: (its JSON, wall seconds), or CppRuntimeError."""
    t0 = time.perf_counter()
    out = run_executable(exe, argv, json_out, launcher)
    return out, time.perf_counter() - t0


def token_rows(case: Any, out: dict[str, Any], exe_name: str) -> list[dict[str, Any]]:
    """Per chunk: the C++ token ids against the case's expected ids (identical to pass)."""
    got = token_ids_of(out, exe_name)
    want = expected_sequences(case.expected["token_ids"])
    rows = [token_record(case.name if len(want) == 1 else f"{case.name}[{i}]", w, got[i] if i < len(got) else [],
                         stage="tokens (cpp vs package expected)", runtime="cpp")
            for i, w in enumerate(want)]
    if len(got) != len(want):
        rows.append({"fixture": case.name, "stage": "chunks", "kind": "text", "runtime": "cpp", "passed": False,
                     "reason": f"cpp gave {len(got)} chunks, expected {len(want)}"})
    return rows


def frame_rows(case: Any, out: dict[str, Any], exe_name: str, package: Path, mode: str = "fp32",
               stages: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The C++ frames against ``expected.frames_sha256`` (bytes), else against ``expected.png``
    by the packaged policy's frames gate of ``mode`` (ncnn builds differ in the last bits). With
    ``stages`` (the model's ``policy_stages``) the packaged policy is read with them, so a model
    whose pipeline has no frames stage is refused rather than judged by the mode's default."""
    from PIL import Image

    from ncnnport.parity.policy import Policy

    got = frames_of(out, exe_name)
    stage = "frames (cpp vs package expected)"
    want_sha = str(case.expected["frames_sha256"])
    if frames_sha256(got) == want_sha:
        return [{"fixture": case.name, "stage": stage, "kind": "frames", "runtime": "cpp", "passed": True,
                 "byte_identical": True, "frames_sha256": want_sha, "reason": "byte-identical"}]
    policy = Path(package) / "policy.json"
    if "expected" not in case.inputs or not policy.is_file():
        return [{"fixture": case.name, "stage": stage, "kind": "frames", "runtime": "cpp", "passed": False,
                 "frames_sha256": frames_sha256(got),
                 "reason": f"frames sha256 {frames_sha256(got)[:16]}, expected {want_sha[:16]} "
                           "(no expected.png or policy.json to judge by the frames gate)"}]
    want = np.asarray(Image.open(case.inputs["expected"]).convert("RGB"))
    want = want.reshape(got.shape) if want.size == got.size else want[None]
    gate = Policy.load(policy, stages=stages).stage(FRAMES_POLICY_STAGE, mode)
    return [frame_record(case.name, stage, want, got, gate)]


def judge(case: Any, out: dict[str, Any], exe_name: str, package: Path, mode: str = "fp32",
          stages: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The rows of one case by what it expects: token ids, or frames (judged in policy ``mode``,
    the policy read with the model's ``stages`` when given)."""
    if "token_ids" in case.expected:
        return token_rows(case, out, exe_name)
    if "frames_sha256" in case.expected:
        return frame_rows(case, out, exe_name, package, mode, stages)
    raise CppRuntimeError(f"{case.folder / 'case.json'}: expected holds neither token_ids nor frames_sha256")


def check_package_case(model: str, package: Path, exe_dir: Path, launcher: Sequence[str] = (),
                       case_name: str | None = None, vulkan: bool = False) -> tuple[list[dict[str, Any]], float, str]:
    """(rows, executable seconds, case name) of one packaged case (``case_name``, else the
    smallest) run by ``exe_dir/<the port's executable>`` under ``launcher`` (with ``--vulkan``
    when ``vulkan``: frames are then judged by the policy's vulkan_fp32 row)."""
    from ncnnport.package.cases import read_cases
    from ncnnport.registry import get_port

    port = get_port(model)
    if not port.cpp_executable:
        raise CppRuntimeError(f"model {model} has no C++ executable")
    exe = Path(exe_dir) / port.cpp_executable
    if not exe.is_file():
        raise CppRuntimeError(f"{exe}: not built")
    try:
        cases = read_cases(package)
    except ValueError as exc:
        raise CppRuntimeError(str(exc)) from None
    if case_name is not None:
        cases = [c for c in cases if c.name == case_name]
        if not cases:
            raise CppRuntimeError(f"{package}: no case named {case_name!r}")
    case = smallest_case(cases)
    with tempfile.TemporaryDirectory(prefix="ncnnport-cpp-case-") as tmp:
        try:
            argv = [*port.cpp_package_argv(Path(package), case, Path(tmp)), *(["--vulkan"] if vulkan else [])]
        except NotImplementedError as exc:
            raise CppRuntimeError(str(exc)) from None
        out, seconds = run_case(launcher, exe, argv, Path(tmp) / "out.json")
        mode = "vulkan_fp32" if vulkan else "fp32"
        return judge(case, out, exe.name, Path(package), mode, port.policy_stages), seconds, case.name


def row_detail(r: dict[str, Any]) -> str:
    """A row's reason, or for a passing token row how many tokens were identical."""
    if r.get("reason"):
        return str(r["reason"])
    return f"{r['tokens_matched']} tokens identical" if r.get("kind") == "tokens" else ""


def rows_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown pass/fail rows with the detail, and the ``N passed, M failed`` line."""
    lines = ["| case | stage | result | detail |", "|---|---|---|---|"]
    lines += [f"| {r['fixture']} | {r['stage']} | {'PASS' if r['passed'] else 'FAIL'} | {row_detail(r)} |"
              for r in rows]
    failed = sum(not r["passed"] for r in rows)
    return "\n".join(lines) + f"\n\n{len(rows) - failed} passed, {failed} failed"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ncnnport.drivers.cpp_package_cases",
                                     description="a package's e2e case through the model's C++ executable")
    parser.add_argument("model")
    parser.add_argument("package", type=Path)
    parser.add_argument("--exe-dir", type=Path, required=True, help="the folder with the built executables")
    parser.add_argument("--launcher", default="", help="a command prefix, e.g. qemu-aarch64")
    parser.add_argument("--case", default=None, help="a case name (default: the one with the smallest inputs)")
    parser.add_argument("--vulkan", action="store_true", help="run the executable with --vulkan (a VULKAN=1 build)")
    args = parser.parse_args(argv)
    from ncnnport.registry import get_port

    if not get_port(args.model).cpp_executable:  # a model without a C++ runtime yet: said, not failed
        print(f"cpp e2e {args.model}: skipped (the model has no C++ executable)")
        return 0
    try:
        rows, seconds, name = check_package_case(args.model, args.package, args.exe_dir, shlex.split(args.launcher),
                                                 args.case, args.vulkan)
    except (CppRuntimeError, subprocess.TimeoutExpired, KeyError) as exc:
        print(f"cpp e2e {args.model}: {exc}", file=sys.stderr)
        return 2
    where = (f" under {args.launcher}" if args.launcher else "") + (" on Vulkan" if args.vulkan else "")
    print(f"## cpp e2e {args.model} {args.package} case {name}{where}: {seconds:.1f} s\n{rows_table(rows)}")
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
