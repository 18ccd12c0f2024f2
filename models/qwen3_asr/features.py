"""Log-mel features in numpy, matching transformers' ``Qwen3ASRFeatureExtractor``.

Why: the ncnn runtime must build the encoder input without torch. This reproduces the HF
extractor called as ``fe(audio, sampling_rate=16000, padding="longest",
return_attention_mask=True)`` for one clip:

* no minimum length: the official package's feature extraction (a WhisperFeatureExtractor
  called with padding=True) pads nothing, and its 0.5 s minimum is applied only to the chunks
  of a cut input (``chunking.split_audio``). transformers' extractor pads every clip to
  ``min_length`` = 8000 samples instead; ``checkpoint.apply_official_audio_rules`` sets that to 0
  on every loaded processor so the reference sees what the official pipeline sees;
* STFT with ``center=True`` and REFLECT padding of n_fft/2 samples at both ends (reading past
  the end as zeros instead is the known parity trap), periodic Hann window, n_fft 400, hop 160;
* the last STFT frame is dropped, so a clip of N samples gives N // 160 frames;
* Slaney-scale, Slaney-normalised 128-band mel filters over 0..8 kHz applied to the power
  spectrum; log10(max(e, 1e-10)); floor at (max - 8); (x + 4) / 4;
* the frame axis is right-padded with zeros to a multiple of 2 * n_window (100) and the mask
  marks the padding 0.

Precision: the frame x window product and the mel filters are rounded to float32 exactly as HF
does (skipping that costs ~3e-5); the FFT, mel sum and log run in float64 (blockwise, so 20
minutes of audio stays a few tens of MB). What remains against HF is HF's own float32 FFT
rounding, which no other FFT reproduces: measured max_abs vs HF is 2e-6..5e-6 on noise and
speech-like audio, ~1e-5 on a loud pure tone and 4.5e-5..6.2e-5 on audio whose voiced frames
leave the upper bands nearly empty (low harmonics + 40 dB pauses); in those cases HF itself is
1e-5..5.5e-5 away from the same recipe with a float64 FFT while this module is <= 5.5e-6 away.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
N_MELS = 128
MIN_SAMPLES = 8000  # 0.5 s, the official minimum chunk length (applied to cut chunks only)
N_WINDOW = 50  # the mel axis is padded to a multiple of 2 * n_window
LOG_FLOOR_DB = 8.0  # dynamic range kept below the maximum, in log10 units
_BLOCK_FRAMES = 4096


@dataclass(frozen=True)
class MelFeatures:
    """``features`` [1, n_mels, T_pad] float32 and ``mask`` [1, T_pad] int32 (1 = real frame)."""

    features: np.ndarray
    mask: np.ndarray

    @property
    def num_frames(self) -> int:
        """Valid frames (the sum of the mask)."""
        return int(self.mask.sum())


def _hz_to_mel_slaney(hz: np.ndarray) -> np.ndarray:
    # Slaney's Auditory Toolbox scale: linear (200/3 Hz per mel) up to 1 kHz, logarithmic above.
    hz = np.asarray(hz, dtype=np.float64)
    lin = hz / (200.0 / 3.0)
    log_step = np.log(6.4) / 27.0
    return np.where(hz >= 1000.0, 15.0 + np.log(np.maximum(hz, 1e-12) / 1000.0) / log_step, lin)


def _mel_to_hz_slaney(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    log_step = np.log(6.4) / 27.0
    return np.where(mel >= 15.0, 1000.0 * np.exp(log_step * (mel - 15.0)), mel * (200.0 / 3.0))


@lru_cache(maxsize=4)
def mel_filters(n_mels: int = N_MELS, n_fft: int = N_FFT, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Triangular Slaney mel filters [n_fft//2+1, n_mels] (float64), area-normalised per band."""
    fft_hz = np.linspace(0.0, sr / 2, n_fft // 2 + 1)
    edges_hz = _mel_to_hz_slaney(np.linspace(_hz_to_mel_slaney(0.0), _hz_to_mel_slaney(sr / 2), n_mels + 2))
    lower, centre, upper = edges_hz[:-2], edges_hz[1:-1], edges_hz[2:]
    rising = (fft_hz[:, None] - lower[None, :]) / (centre - lower)[None, :]
    falling = (upper[None, :] - fft_hz[:, None]) / (upper - centre)[None, :]
    tri = np.maximum(0.0, np.minimum(rising, falling))
    return tri * (2.0 / (upper - lower))[None, :]


@lru_cache(maxsize=4)
def hann_periodic(n: int = N_FFT) -> np.ndarray:
    """Periodic Hann as torch builds it in float32: angle = float32(k) * float32(2*pi/n), then
    0.5 - 0.5*cos. HF multiplies the frames by this float32 window in float32, and that rounding
    is visible in quiet bands, so it is reproduced here (a float64 window costs ~3e-5 max_abs).
    torch's float32 cos may still differ by 1 ulp on a few entries."""
    angle = np.arange(n + 1, dtype=np.float32) * np.float32(2.0 * np.pi / n)
    window = np.cos(angle.astype(np.float64)).astype(np.float32) * np.float32(-0.5) + np.float32(0.5)
    return window[:n]


def pad_to_min_length(wave: np.ndarray, min_samples: int = MIN_SAMPLES) -> np.ndarray:
    """Zero-pad at the tail up to ``min_samples`` (the official 0.5 s minimum)."""
    if wave.shape[0] >= min_samples:
        return wave
    return np.pad(wave, (0, min_samples - wave.shape[0]))


def mel_power(wave: np.ndarray) -> np.ndarray:
    """Mel energies [n_mels, N // hop] of a 1-D float waveform (reflect-padded centred STFT)."""
    x = np.asarray(wave, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"waveform must be 1-D, got shape {x.shape}")
    half = N_FFT // 2
    if x.shape[0] <= half:
        raise ValueError(f"waveform of {x.shape[0]} samples is too short to reflect-pad by {half}")
    padded = np.pad(x, (half, half), mode="reflect")
    n_frames = x.shape[0] // HOP  # HF drops the last of the 1 + N // hop centred frames
    window = hann_periodic(N_FFT)
    # HF applies float32 filters; round them the same way, then accumulate in float64.
    filters = mel_filters().astype(np.float32).astype(np.float64)
    frames_f32 = np.lib.stride_tricks.sliding_window_view(padded.astype(np.float32), N_FFT)[::HOP]
    out = np.empty((N_MELS, n_frames), dtype=np.float64)
    for start in range(0, n_frames, _BLOCK_FRAMES):
        stop = min(n_frames, start + _BLOCK_FRAMES)
        windowed = (frames_f32[start:stop] * window).astype(np.float64)  # float32 product, as HF
        spec = np.fft.rfft(windowed, n=N_FFT, axis=-1)
        power = spec.real**2 + spec.imag**2
        out[:, start:stop] = (power @ filters).T
    return out


def log_mel(wave: np.ndarray) -> np.ndarray:
    """Normalised log-mel [n_mels, N // hop] float32 (no min-length or chunk padding)."""
    log_spec = np.log10(np.maximum(mel_power(wave), 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - LOG_FLOOR_DB)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)


def extract_features(wave: np.ndarray, n_window: int = N_WINDOW, min_samples: int = 0) -> MelFeatures:
    """16 kHz mono waveform -> HF-equal ``input_features`` and ``input_features_mask``.

    ``min_samples`` defaults to 0 (the official pipeline pads no single input; see the module
    docstring); the waveform needs more than ``N_FFT // 2`` samples, as the official STFT does."""
    x = np.asarray(wave, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"waveform must be 1-D mono, got shape {x.shape}")
    if x.shape[0] == 0:
        raise ValueError("waveform is empty")
    if min_samples:
        x = pad_to_min_length(x, min_samples)
    mel = log_mel(x)
    frames = mel.shape[1]
    multiple = 2 * n_window
    pad = (-frames) % multiple if multiple > 1 else 0
    features = np.zeros((1, N_MELS, frames + pad), dtype=np.float32)
    features[0, :, :frames] = mel
    mask = np.zeros((1, frames + pad), dtype=np.int32)
    mask[0, :frames] = 1
    return MelFeatures(features=features, mask=mask)
