"""`make` targets run from the C++ tests: the environment a user's shell would give them, and the
build tree's lock (one `make cpp` at a time in build/cpp)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_make(target: str) -> subprocess.CompletedProcess:
    """``make TARGET`` in the repository, as a user would type it.

    Why the environment is cleaned: under `make test ARGS="..."` (CI) make exports its command-line
    variables, both as environment variables and through MAKEFLAGS, and a nested make would pass
    the pytest ARGS on to the target's commands (`ncnnport-cpp verify ... -q -p no:cacheprovider`:
    exit 2 in CI)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "ARGS")}
    return subprocess.run(["make", target], cwd=ROOT, capture_output=True, text=True, check=False, env=env)


def make_cpp() -> None:
    """`make cpp` (ncnn from the cache, then an incremental CMake build) under the build tree's
    lock; a failure fails the test."""
    from filelock import FileLock

    (ROOT / "build").mkdir(exist_ok=True)
    with FileLock(str(ROOT / "build" / "cpp.make.lock")):
        res = run_make("cpp")
    if res.returncode != 0:
        pytest.fail(f"make cpp failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
