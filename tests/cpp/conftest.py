"""Shared by the C++ runtime tests: `make cpp` at most once per session, under a lock.

Why one fixture: every executable comes out of the same CMake tree (build/cpp), and two `make cpp`
runs in one tree (two test files, or a test beside a user's build) break each other's objects;
the lock (filelock, the build folders' own lock library) makes a second process wait instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest

from tests.cpp.make_targets import make_cpp
from tests.cpp.packages import tiny_package


@pytest.fixture(scope="session")
def built_cpp() -> Callable[[Path, str], Path]:
    """``built_cpp(exe, env_var)``: ``exe`` after one `make cpp` per session, unless ``env_var``
    is set (then ``exe`` is a prebuilt executable the caller named, used as it is)."""
    done: list[bool] = []

    def get(exe: Path, env_var: str) -> Path:
        if env_var not in os.environ and not done:
            make_cpp()
            done.append(True)
        assert exe.is_file(), f"{exe} was not built"
        return exe

    return get


@pytest.fixture(scope="session")
def package() -> Callable[[str], Path]:
    """``package(model)``: the model's tiny package in build/ (tests/cpp/packages.py)."""
    return tiny_package
