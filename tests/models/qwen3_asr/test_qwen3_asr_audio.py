"""Reading audio files of any rate/channels/format into mono float32 16 kHz, and clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from ncnnport.models.qwen3_asr.audio import AudioError, check_audio_file, prepare_waveform, read_audio
from ncnnport.models.qwen3_asr.features import extract_features


def stereo_tone(sr: int, seconds: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Left 0.6*sin(440), right 0.2*sin(440) (+ a 1 kHz tone only on the right).
    Returns (stereo [n, 2], expected mono at 16 kHz = the channel average on a 16 kHz grid)."""
    t = np.arange(int(sr * seconds)) / sr
    left = 0.6 * np.sin(2 * np.pi * 440 * t)
    right = 0.2 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 1000 * t)
    t16 = np.arange(int(16000 * seconds)) / 16000
    expected = 0.4 * np.sin(2 * np.pi * 440 * t16) + 0.05 * np.sin(2 * np.pi * 1000 * t16)
    return np.stack([left, right], axis=1), expected


def check_against(out: np.ndarray, expected: np.ndarray, tol: float) -> None:
    assert out.dtype == np.float32 and out.ndim == 1
    assert abs(out.shape[0] - expected.shape[0]) <= 1
    n = min(out.shape[0], expected.shape[0])
    core = slice(200, n - 200)  # resampler edge transients
    err = float(np.abs(out[core] - expected[core]).max())
    assert err < tol, f"max_abs {err:.3g} vs the ideal 16 kHz mono signal"


@pytest.mark.parametrize(
    "suffix,subtype,tol",
    [
        (".wav", "FLOAT", 2e-3),
        (".wav", "PCM_16", 2e-3),
        (".flac", "PCM_16", 2e-3),
        (".ogg", "VORBIS", 5e-2),  # lossy
    ],
)
def test_read_8k_stereo(tmp_path: Path, suffix: str, subtype: str, tol: float) -> None:
    stereo, expected = stereo_tone(8000)
    path = tmp_path / f"tone{suffix}"
    sf.write(str(path), stereo.astype(np.float32), 8000, subtype=subtype)
    check_against(read_audio(path), expected, tol)


def test_read_48k_mono_int24_and_16k_passthrough(tmp_path: Path) -> None:
    stereo, expected = stereo_tone(48000)
    mono = stereo.mean(axis=1)
    path = tmp_path / "m.wav"
    sf.write(str(path), mono, 48000, subtype="PCM_24")
    check_against(read_audio(path), expected, 2e-3)
    x16 = (0.1 * np.sin(np.arange(16000) / 7.0)).astype(np.float32)
    p16 = tmp_path / "p16.wav"
    sf.write(str(p16), x16, 16000, subtype="FLOAT")
    np.testing.assert_array_equal(read_audio(p16), x16)  # no resampling at 16 kHz


def test_prepare_waveform_int16_array_scaling() -> None:
    pcm = np.array([[-32768, 32767], [16384, 0]], dtype=np.int16)
    out = prepare_waveform(pcm, 16000)
    np.testing.assert_allclose(out, [(-1.0 + 32767 / 32768) / 2, 0.25], atol=1e-7)


def test_missing_file() -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        read_audio("/nonexistent/dir/clip.wav")


def test_not_audio(tmp_path: Path) -> None:
    path = tmp_path / "notes.wav"
    path.write_text("this is not audio\n" * 10)
    with pytest.raises(AudioError, match="not a readable audio file"):
        read_audio(path)
    with pytest.raises(AudioError, match="directory"):
        read_audio(tmp_path)


def test_empty_audio(tmp_path: Path) -> None:
    path = tmp_path / "empty.wav"
    sf.write(str(path), np.zeros((0, 2), np.float32), 16000)
    with pytest.raises(AudioError, match="empty"):
        read_audio(path)
    with pytest.raises(AudioError, match="empty"):
        prepare_waveform(np.zeros((0,), np.float32), 16000)


def test_nan_audio_rejected() -> None:
    with pytest.raises(AudioError, match="NaN"):
        prepare_waveform(np.array([0.0, np.nan], np.float32), 16000)


@pytest.mark.parametrize("sr", [8000, 16000, 48000])
def test_one_sample_audio_is_refused_naming_the_file(tmp_path: Path, sr: int) -> None:
    # the official pipeline pads no single input, and its STFT needs > 200 samples
    path = tmp_path / "one.wav"
    sf.write(str(path), np.array([0.5], np.float32), sr, subtype="FLOAT")
    wave = read_audio(path)
    assert 1 <= wave.shape[0] <= 2
    with pytest.raises(ValueError, match="too short"):
        extract_features(wave)
    with pytest.raises(AudioError, match="one.wav.*too short"):
        check_audio_file(path)
