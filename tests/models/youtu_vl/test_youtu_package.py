"""Youtu-VL from its package alone: ``verify`` and ``run --package`` without torch or
transformers, equal to today's run path."""

from __future__ import annotations

import json

import pytest

from tests.torchfree import blocking_env, cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def no_torch(tmp_path_factory) -> dict[str, str]:
    return blocking_env(tmp_path_factory.mktemp("block"))


def test_model_json_config_reads_back_to_the_reference_config(built):
    from ncnnport.models.youtu_vl.packaged import packaged_config

    prep, pkg = built
    assert packaged_config(pkg, json.loads((pkg / "model.json").read_text())) == prep.loaded.reference.cfg


def test_verify_passes_without_torch(built, no_torch):
    _, pkg = built
    r = cli("verify", pkg, env=no_torch)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| case | image_one_window | PASS |" in r.stdout and "| case | text_only | PASS |" in r.stdout


@pytest.mark.parametrize("extra", [("--image", "cases/image_one_window/input.png", "--prompt", "What is this?"),
                                   ("--prompt", "Tell me a short story."),
                                   ("--prompt", "hi", "--precision", "fp16-storage")])  # decode variants
def test_run_package_equals_todays_run_path_without_torch(built, no_torch, extra):
    _, pkg = built
    root = pkg.parent.parent.parent
    extra = tuple(str(pkg / a) if a.startswith("cases/") else a for a in extra)
    args = ("run", "youtu-vl", *extra, "--max-new-tokens", 24, "--show-special")
    old = cli(*args, "--build-dir", root)
    new = cli(*args, "--package", pkg, env=no_torch)
    assert old.returncode == 0 and new.returncode == 0, old.stderr + new.stderr
    assert new.stdout == old.stdout and new.stdout.strip()
