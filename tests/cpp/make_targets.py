"""`make` targets run from the C++ tests: the environment a user's shell would give them, and the
build tree's lock (one `make cpp` at a time in build/cpp)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_make(target: str, *variables: str) -> subprocess.CompletedProcess:
    """``make TARGET [VAR=value...]`` in the repository, as a user would type it.

    Why the environment is cleaned: under `make test ARGS="..."` (CI) make exports its command-line
    variables, both as environment variables and through MAKEFLAGS, and a nested make would pass
    the pytest ARGS on to the target's commands (`ncnnport-cpp verify ... -q -p no:cacheprovider`:
    exit 2 in CI)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "ARGS")}
    return subprocess.run(["make", target, *variables], cwd=ROOT, capture_output=True, text=True, check=False, env=env)


def make_cpp(vulkan: bool = False) -> None:
    """`make cpp` (`make cpp VULKAN=1` into build/cpp-vulkan) (ncnn from the cache, then an
    incremental CMake build) under that build tree's lock; a failure fails the test."""
    from filelock import FileLock

    tree = "cpp-vulkan" if vulkan else "cpp"
    (ROOT / "build").mkdir(exist_ok=True)
    with FileLock(str(ROOT / "build" / f"{tree}.make.lock")):
        res = run_make("cpp", *(["VULKAN=1"] if vulkan else []))
    if res.returncode != 0:
        pytest.fail(f"make cpp{' VULKAN=1' if vulkan else ''} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
