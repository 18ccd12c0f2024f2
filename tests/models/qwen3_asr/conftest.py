"""Shared fixtures for the Qwen3-ASR host-side tests (1 torch thread: the machine is shared)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """The tiny preset written as a checkpoint folder into a private cache for this session."""
    from ncnnport.models.qwen3_asr.presets import preset_folder

    return preset_folder("tiny", cache_dir=tmp_path_factory.mktemp("qwen3_asr_cache"))


@pytest.fixture(scope="session")
def tiny_loaded(tiny_folder):
    from ncnnport.models.qwen3_asr.checkpoint import load_checkpoint

    return load_checkpoint(tiny_folder)


def speech_like(seconds: float, seed: int = 0, sr: int = 16000) -> np.ndarray:
    """A voiced-speech-like test signal: gliding harmonic source, syllable-rate envelope, noise."""
    rng = np.random.RandomState(seed)
    n = int(round(seconds * sr))
    t = np.arange(n) / sr
    f0 = 120 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voiced = sum(np.sin(k * phase) / k for k in range(1, 30)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) ** 2
    return (0.2 * voiced + 0.003 * rng.randn(n)).astype(np.float32)
