"""Shared fixtures for the Youtu-VL tests: one seeded tiny checkpoint folder per session."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    from ncnnport.models.youtu_vl.presets import materialise_preset

    return materialise_preset("tiny", seed=0, root=tmp_path_factory.mktemp("youtu_presets"))


@pytest.fixture(scope="session")
def tiny(tiny_folder):
    from ncnnport.models.youtu_vl.checkpoint import load_checkpoint

    return load_checkpoint(tiny_folder)


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The generic stages on the tiny preset: (Prepared, package folder), converted once per session."""
    from ncnnport.stages import convert_stage, prepare
    from ncnnport.targets import Target

    prep = prepare(Target("youtu-vl", "tiny", None, tmp_path_factory.mktemp("youtu_build")))
    return prep, convert_stage(prep)
