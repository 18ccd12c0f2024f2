"""The base distribution alone, as a deployer installs it: a wheel of this project installed into
a fresh venv (no system site-packages, no export extra) runs ``verify`` on packed archives and
``run --package`` with the same output as the full install. Needs PyPI (or its mirror) for the
base dependencies; a warm pip cache keeps it near two minutes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.torchfree import cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "__pycache__", "*.egg-info", ".pytest_cache")
# run arguments per model: ``cases/...`` is a file of the built package; ``{out}`` an output path
# of its own per install (the two runs' stdout must then be equal up to that path)
CASES = {"qwen3-asr": ("--audio", "cases/speech_2s/input.wav", "--max-new-tokens", "40"),
         "youtu-vl": ("--image", "cases/image_one_window/input.png", "--prompt", "What is this?",
                      "--max-new-tokens", "24", "--show-special"),
         "seedvr2": ("--input", "cases/image_64x96/input.png", "--noise", "cases/image_64x96/noise.npz",
                     "--output", "{out}")}


def run_args(model: str, pkg: Path, out: Path) -> list[str]:
    """CASES[model] with package files and the output path filled in."""
    return [str(pkg / a) if a.startswith("cases/") else a.replace("{out}", str(out)) for a in CASES[model]]


def clean_env() -> dict[str, str]:
    """This environment without anything that would put the source tree or the test venv on
    the new venv's path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def run(*cmd: object, cwd: Path) -> subprocess.CompletedProcess:
    """A command with output captured; a failure shows its output."""
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{cmd}: {r.stdout[-3000:]}{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def base_bin(tmp_path_factory) -> Path:
    """The ``bin`` folder of a fresh venv holding this project's wheel and its base dependencies."""
    tmp = tmp_path_factory.mktemp("base")
    src = tmp / "src"  # a copy: building in the tree would write build/ and *.egg-info into it
    shutil.copytree(ROOT, src, ignore=SKIP)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp / "wheel", src, cwd=tmp)
    (wheel,) = (tmp / "wheel").glob("ncnnport-*.whl")
    run(sys.executable, "-m", "venv", tmp / "venv", cwd=tmp)
    run(tmp / "venv/bin/python", "-m", "pip", "install", "-q", wheel, cwd=tmp)
    return tmp / "venv/bin"


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> tuple[Path, Path]:
    """(build root, archive folder): both tiny packages packed with this (full) install's CLI."""
    tmp = tmp_path_factory.mktemp("packs")
    for model in CASES:
        r = cli("pack", model, "--build-dir", tmp / "build", "--out", tmp / "out")
        assert r.returncode == 0, r.stdout + r.stderr
    return tmp / "build", tmp / "out"


def test_base_venv_cannot_import_torch_transformers_or_pnnx(base_bin, tmp_path):
    for name in ("torch", "transformers", "pnnx"):
        r = subprocess.run([base_bin / "python", "-c", f"import {name}"], cwd=tmp_path, env=clean_env(),
                           capture_output=True, text=True)
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, (name, r.stderr)
    r = subprocess.run([base_bin / "python", "-c", "import ncnnport, sys; print(ncnnport.__file__)"], cwd=tmp_path,
                       env=clean_env(), capture_output=True, text=True)
    assert r.returncode == 0 and "site-packages" in r.stdout, r.stdout + r.stderr  # the wheel, not the tree


@pytest.mark.parametrize("model", list(CASES))
def test_base_install_verifies_archive_and_runs_it_like_the_full_install(model, base_bin, packs, tmp_path):
    build, out = packs
    (archive,) = out.glob(f"{model}-*.tar.gz")
    r = run(base_bin / "ncnnport", "verify", archive, cwd=tmp_path)
    assert "FAIL" not in r.stdout and "| case |" in r.stdout, r.stdout
    pkg = build / model / "tiny" / "package"
    assert run(base_bin / "ncnnport", "check", "--package", pkg, cwd=tmp_path).stdout.strip().endswith("OK")
    outs = {k: tmp_path / f"{k}.png" for k in ("base", "full")}
    base = run(base_bin / "ncnnport", "run", model, *run_args(model, pkg, outs["base"]), "--package", archive, cwd=tmp_path)
    full = cli("run", model, *run_args(model, pkg, outs["full"]), "--package", archive)
    assert full.returncode == 0, full.stderr
    assert base.stdout.replace(str(outs["base"]), "OUT") == full.stdout.replace(str(outs["full"]), "OUT")
    assert base.stdout.strip()
    if "{out}" in CASES[model]:  # frames: the same bytes
        assert outs["base"].read_bytes() == outs["full"].read_bytes()


def test_export_verb_in_base_install_says_how_to_get_the_export_extra(base_bin, tmp_path):
    r = subprocess.run([base_bin / "ncnnport", "convert", "qwen3-asr", "--build-dir", tmp_path / "b"], cwd=tmp_path,
                       env=clean_env(), capture_output=True, text=True)
    assert r.returncode == 2 and "pip install 'ncnnport[export]'" in r.stderr, r.stderr
