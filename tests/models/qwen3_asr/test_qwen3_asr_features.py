"""log-mel in numpy vs transformers' Qwen3ASRFeatureExtractor (padding="longest", mask on)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Qwen3ASRFeatureExtractor

from ncnnport.models.qwen3_asr.features import extract_features, mel_filters

from .conftest import speech_like

HF_TOL = 1e-5


def hf_features(wave: np.ndarray, min_length: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """transformers' extractor; ``min_length=0`` is the official rule (no single-clip padding)."""
    fe = Qwen3ASRFeatureExtractor(min_length=min_length)
    out = fe(wave, sampling_rate=16000, padding="longest", return_attention_mask=True, return_tensors="np")
    return out["input_features"], out["attention_mask"]


@pytest.mark.parametrize(
    "num_samples",
    [
        32000,  # ~2 s, whole frames
        160000,  # 10 s
        16000 * 3 + 77,  # partial last hop: the reflect-padding edge
        8159,  # just above the 0.5 s minimum, partial hop
        3000,  # below 0.5 s: not padded (official), 18 frames
    ],
)
def test_log_mel_matches_hf(num_samples: int) -> None:
    wave = speech_like(num_samples / 16000, seed=num_samples)[:num_samples]
    wave[-40:] += np.linspace(0, 0.5, 40, dtype=np.float32)  # energy right at the end (edge trap)
    ref, ref_mask = hf_features(wave)
    ours = extract_features(wave)
    assert ours.features.shape == ref.shape
    assert ours.features.dtype == np.float32
    np.testing.assert_array_equal(ours.mask, ref_mask)
    err = float(np.abs(ours.features - ref).max())
    assert err <= HF_TOL, f"log-mel max_abs {err:.3g} > {HF_TOL}"
    # the last valid frame is the one that reads the reflected tail
    last = int(ref_mask.sum()) - 1
    assert float(np.abs(ours.features[0, :, last] - ref[0, :, last]).max()) <= HF_TOL


def test_zero_padding_at_end_would_fail() -> None:
    """Guard against the known trap: zeros instead of reflection at the edges change the features."""
    wave = speech_like(2.0, seed=3)
    wave[-200:] = 0.4
    ref, _ = hf_features(wave)
    ours = extract_features(wave).features
    from ncnnport.models.qwen3_asr import features as F

    half = F.N_FFT // 2
    padded = np.pad(wave.astype(np.float64), (half, half))  # zeros, not reflect
    frames = np.lib.stride_tricks.sliding_window_view(padded, F.N_FFT)[:: F.HOP][: wave.size // F.HOP]
    spec = np.fft.rfft(frames * F.hann_periodic(), axis=-1)
    mel = (np.abs(spec) ** 2 @ mel_filters()).T
    log_spec = np.log10(np.maximum(mel, 1e-10))
    zero_pad = (np.maximum(log_spec, log_spec.max() - 8) + 4) / 4
    assert np.abs(zero_pad - ref[0, :, : zero_pad.shape[1]]).max() > 1e-3
    assert np.abs(ours - ref).max() <= HF_TOL


def tone(n: int) -> np.ndarray:
    t = np.arange(n) / 16000
    return (0.3 * np.sin(2 * np.pi * 440 * t) * np.linspace(0, 1, n)
            + 0.02 * np.random.RandomState(0).randn(n)).astype(np.float32)


def with_pauses(n: int) -> np.ndarray:
    """Low harmonics (< 600 Hz) alternating with broadband noise at a syllable rate, 40 dB pauses:
    in the voiced frames the upper bands hold almost nothing."""
    rng = np.random.RandomState(5)
    t = np.arange(n) / 16000
    phase = 2 * np.pi * np.cumsum(110 + 60 * np.sin(2 * np.pi * 0.7 * t)) / 16000
    voiced = sum(np.sin(k * phase) / k for k in range(1, 6))
    syllable = 0.5 + 0.5 * np.sin(2 * np.pi * 3.1 * t)
    wave = 0.2 * (voiced * syllable + 0.3 * rng.randn(n) * (1 - syllable))
    for start in range(int(1.6 * 16000), n, 2 * 16000):
        wave[start : start + 6400] *= 0.01  # 0.4 s pauses, 40 dB down
    return wave.astype(np.float32)


def float64_fft_recipe(wave: np.ndarray) -> np.ndarray:
    """HF's recipe with its float32 frame x window product but a float64 FFT and mel sum (torch,
    independent of our numpy framing): the 'true' value HF approximates in float32."""
    n = wave.size
    x = torch.nn.functional.pad(torch.from_numpy(wave)[None, None], (200, 200), mode="reflect")[0, 0]
    frames = x.unfold(0, 400, 160)[: n // 160] * torch.hann_window(400)
    power = torch.fft.rfft(frames.double(), dim=-1).abs() ** 2
    filters = torch.from_numpy(mel_filters().astype(np.float32)).double()
    log_spec = torch.clamp(filters.T @ power.T, min=1e-10).log10()
    return ((torch.maximum(log_spec, log_spec.max() - 8.0) + 4.0) / 4.0).numpy()


@pytest.mark.parametrize("make", [tone, with_pauses])
def test_high_dynamic_range_within_hf_float32_noise(make) -> None:
    """Quiet bands next to strong ones (a loud tone; 40 dB pauses): HF's float32 FFT rounding
    then dominates the quiet bands' energy, so HF itself sits up to ~6e-5 off the float64 value.
    Ours must stay on the float64 value (1e-5; torch's window differs by 1 ulp on a few taps)
    and within that HF noise of HF (1e-4)."""
    wave = make(160000)
    ref, _ = hf_features(wave)
    ours = extract_features(wave).features
    exact = float64_fft_recipe(wave)
    ours_vs_exact = np.abs(ours[0, :, : exact.shape[1]] - exact).max()
    hf_vs_exact = np.abs(ref[0, :, : exact.shape[1]] - exact).max()
    assert ours_vs_exact <= 1e-5
    assert ours_vs_exact < hf_vs_exact
    assert np.abs(ours - ref).max() <= 1e-4


def test_mel_filters_match_hf() -> None:
    assert np.abs(mel_filters() - Qwen3ASRFeatureExtractor().mel_filters).max() < 1e-12


def test_features_reject_bad_input() -> None:
    with pytest.raises(ValueError):
        extract_features(np.zeros((0,), np.float32))
    with pytest.raises(ValueError):
        extract_features(np.zeros((2, 16000), np.float32))


def test_min_samples_reproduces_transformers_default_padding() -> None:
    wave = speech_like(3000 / 16000, seed=3)[:3000]
    ref, ref_mask = hf_features(wave, min_length=8000)
    ours = extract_features(wave, min_samples=8000)
    np.testing.assert_array_equal(ours.mask, ref_mask)
    assert int(ref_mask.sum()) == 50 and extract_features(wave).num_frames == 18
    assert float(np.abs(ours.features - ref).max()) <= HF_TOL
