"""The distribution split: the base install runs packages alone; the ``export`` extra brings
torch, transformers and pnnx, and a verb that needs them says how to install them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.torchfree import blocking_env, cli

ROOT = Path(__file__).resolve().parents[2]
EXPORT = {"torch", "transformers", "pnnx"}


def names(requirements: list[str]) -> set[str]:
    """Distribution names of requirement strings (``torch==2.13.0`` -> ``torch``)."""
    return {re.split(r"[\s=<>!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


@pytest.fixture(scope="module")
def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_base_install_has_no_export_dependency(project):
    base = names(project["dependencies"])
    assert not base & EXPORT, base & EXPORT
    assert {"ncnn", "numpy", "tokenizers", "soundfile", "soxr", "pillow", "safetensors"} <= base


def test_export_extra_holds_torch_transformers_pnnx_and_test_pulls_it(project):
    extras = project["optional-dependencies"]
    assert names(extras["export"]) >= EXPORT
    assert "ncnnport[export,report,bench]" in extras["test"]


def test_make_setup_installs_the_test_extra():
    setup = re.search(r"^\$\(STAMP\):.*?(?=^\S)", (ROOT / "Makefile").read_text(), re.M | re.S).group(0)
    assert "install -q -e '.[test]'" in setup


@pytest.fixture(scope="module")
def no_torch(tmp_path_factory) -> dict[str, str]:
    return blocking_env(tmp_path_factory.mktemp("block"))


@pytest.mark.parametrize("argv", [("export", "qwen3-asr"), ("convert", "youtu-vl"), ("parity", "qwen3-asr"),
                                  ("bench", "qwen3-asr"), ("nightly",), ("pack", "qwen3-asr", "--out", "{tmp}"),
                                  ("run", "qwen3-asr", "--audio", "{tmp}.wav"), ("check", "qwen3-asr"),
                                  ("isa-replay", "dump", "qwen3-asr", "{tmp}")])
def test_export_verb_without_torch_says_pip_install_export_in_one_line(argv, no_torch, tmp_path):
    argv = [a.format(tmp=tmp_path / "out") for a in argv]
    r = cli(*argv, "--build-dir", tmp_path / "build", env=no_torch) if argv[0] not in ("isa-replay",) \
        else cli(*argv, env=no_torch)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'ncnnport[export]'" in lines[0] and "torch" in lines[0], r.stderr
    assert not (tmp_path / "build").exists()  # refused before any work


def test_torch_free_verbs_are_not_refused(no_torch, tmp_path):
    r = cli("verify", tmp_path / "absent", env=no_torch)
    assert "ncnnport[export]" not in r.stderr and r.returncode == 2
    assert "absent" in r.stderr
