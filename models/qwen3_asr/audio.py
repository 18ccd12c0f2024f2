"""Read any audio file into the model's input: mono float32 at 16 kHz.

Why: public ncnn ports accept only 16 kHz mono PCM16 WAV. The official Qwen3-ASR recipe averages
channels to mono and resamples to 16 kHz; this module does the same for wav/flac/ogg (and
whatever else libsndfile reads) at any rate, channel count and sample format, with errors that
say what is wrong with the file instead of a traceback from deep inside libsndfile.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

TARGET_SR = 16000
# soxr "HQ" is what librosa's default resampler ("soxr_hq") uses, i.e. the official recipe.
RESAMPLE_QUALITY = "HQ"


class AudioError(ValueError):
    """The input cannot be turned into audio samples (not audio, empty, bad shape)."""


def to_mono(samples: np.ndarray) -> np.ndarray:
    """[n] or [n, channels] -> [n] float32, channels averaged (the official stereo rule)."""
    x = np.asarray(samples)
    if x.ndim == 1:
        return x.astype(np.float32, copy=False)
    if x.ndim != 2:
        raise AudioError(f"audio must be [samples] or [samples, channels], got shape {x.shape}")
    if x.shape[1] == 0:
        raise AudioError("audio has 0 channels")
    return x.astype(np.float64).mean(axis=1).astype(np.float32)


def resample(samples: np.ndarray, sr: int, target_sr: int = TARGET_SR) -> np.ndarray:
    """Mono float32 resampling with soxr; identity when the rate already matches."""
    if sr <= 0:
        raise AudioError(f"invalid sample rate {sr}")
    x = np.ascontiguousarray(samples, dtype=np.float32)
    if sr == target_sr:
        return x
    out = soxr.resample(x, sr, target_sr, quality=RESAMPLE_QUALITY)
    if out.size == 0 and x.size > 0:
        # soxr rounds a few input samples down to nothing (1 sample at 48 kHz -> 0 at 16 kHz).
        # Keep at least one sample by linear interpolation so a non-empty input stays non-empty;
        # the official 0.5 s minimum zero-padding then applies downstream.
        n_out = max(1, int(round(x.size * target_sr / sr)))
        t_out = np.arange(n_out) * (sr / target_sr)
        out = np.interp(t_out, np.arange(x.size), x)
    return np.ascontiguousarray(out, dtype=np.float32)


def float_range_normalize(wave: np.ndarray) -> np.ndarray:
    """The official range rule, applied after resampling: a waveform whose peak |x| exceeds 1
    is divided by that peak, then everything is clipped to [-1, 1]; a peak <= 1 (or silence)
    is left as is.

    Why: float WAV/FLAC may hold samples above full scale, and resampling a full-scale signal
    can overshoot 1; the official ``normalize_audio_input`` (qwen-asr 0.0.6, inference/utils.py,
    ``float_range_normalize`` after ``librosa.resample``) rescales such input, so the model must
    see the same samples here."""
    x = np.asarray(wave, dtype=np.float32)
    if x.size == 0:
        return x
    peak = float(np.max(np.abs(x)))
    if peak > 1.0:
        x = x / np.float32(peak)
    return np.clip(x, -1.0, 1.0).astype(np.float32, copy=False)


def prepare_waveform(samples: np.ndarray, sr: int, target_sr: int = TARGET_SR) -> np.ndarray:
    """Array (any channels/dtype) -> mono float32 at ``target_sr``, range-normalised by the
    official rule (:func:`float_range_normalize`). Integer PCM is scaled to [-1, 1) first."""
    x = np.asarray(samples)
    if x.size == 0:
        raise AudioError("audio is empty (0 samples)")
    if np.issubdtype(x.dtype, np.integer):
        info = np.iinfo(x.dtype)
        x = x.astype(np.float64) / float(-info.min if info.min < 0 else (info.max + 1) / 2)
        if info.min == 0:  # unsigned PCM is centred at half range
            x = x - 1.0
    mono = to_mono(x)
    if not np.all(np.isfinite(mono)):
        raise AudioError("audio contains NaN or Inf samples")
    out = resample(mono, sr, target_sr)
    if out.size == 0:
        raise AudioError(f"audio of {mono.size} sample(s) at {sr} Hz resamples to 0 samples")
    return float_range_normalize(out)


def read_audio(path: str | Path, target_sr: int = TARGET_SR) -> np.ndarray:
    """Read wav/flac/ogg/... -> mono float32 at ``target_sr`` (16 kHz).

    Very short audio (down to 1 sample) is returned as is; the 0.5 s minimum of the official rule
    is applied where the model input is built (zero-padding at the tail), not here.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"audio file not found: {p}")
    if p.is_dir():
        raise AudioError(f"{p} is a directory, not an audio file")
    try:
        data, sr = sf.read(str(p), dtype="float32", always_2d=True)
    except sf.LibsndfileError as exc:
        raise AudioError(f"{p}: not a readable audio file ({exc})") from exc
    except RuntimeError as exc:  # older soundfile raises RuntimeError
        raise AudioError(f"{p}: not a readable audio file ({exc})") from exc
    if data.shape[0] == 0:
        raise AudioError(f"{p}: audio is empty (0 samples)")
    return prepare_waveform(data, int(sr), target_sr)


# The official features need more than n_fft / 2 samples (a reflect-padded centred STFT).
MIN_DECODABLE_SAMPLES = 201


def check_audio_file(path: str | Path) -> np.ndarray:
    """Read ``path`` as the model will and raise :class:`AudioError` (a ValueError) naming the
    file when it is missing, a directory, not decodable, empty, or too short for the official
    features (<= 200 samples at 16 kHz). Returns the 16 kHz waveform.

    Why: the CLI calls this before any model is built, so a bad input costs milliseconds."""
    p = Path(path)
    if not p.exists():
        raise AudioError(f"audio file not found: {p}")
    wave = read_audio(p)
    if wave.shape[0] < MIN_DECODABLE_SAMPLES:
        raise AudioError(f"{p}: audio too short ({wave.shape[0]} samples at {TARGET_SR} Hz; the "
                         f"official features need at least {MIN_DECODABLE_SAMPLES})")
    return wave
