"""Fidelity to the official qwen-asr 0.0.6 ``transcribe()``: audio range and minimum-length rules,
output parsing/joining, forced languages, input validation and the official-reference report."""

from __future__ import annotations

import os
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from ncnnport.models.qwen3_asr import official_ref
from ncnnport.models.qwen3_asr.audio import prepare_waveform
from ncnnport.models.qwen3_asr.chunking import ParsedOutput, join_results, merge_languages, parse_asr_output, split_audio
from ncnnport.models.qwen3_asr.features import extract_features
from ncnnport.models.qwen3_asr.port import PORT
from ncnnport.models.qwen3_asr.prompt import audio_token_count, build_prompt

from .conftest import speech_like


# --- item 12: range normalisation and the minimum length --------------------------------------------
def test_float_input_above_full_scale_is_divided_by_its_peak() -> None:
    x = np.array([0.5, 2.0, -4.0, 1.0] * 100, np.float32)
    out = prepare_waveform(x, 16000)
    np.testing.assert_allclose(out, x / 4.0, rtol=0, atol=0)
    quiet = np.array([0.5, -1.0, 0.25] * 100, np.float32)
    np.testing.assert_array_equal(prepare_waveform(quiet, 16000), quiet)


def test_single_short_clip_is_not_padded(tiny_loaded) -> None:
    _, processor = tiny_loaded
    wave = speech_like(0.2)
    (chunk,) = split_audio(wave)
    assert chunk.samples.shape[0] == 3200
    assert extract_features(chunk.samples).num_frames == 20
    prompt = build_prompt(processor, chunk.samples)
    assert int(prompt.input_features_mask.sum()) == 20
    assert prompt.num_audio_tokens == audio_token_count(20)


def test_short_chunks_of_a_cut_input_are_still_padded() -> None:
    wave = speech_like(2.1)
    chunks = split_audio(wave, max_seconds=1.0, search_seconds=0.01)
    assert len(chunks) == 3 and chunks[-1].end - chunks[-1].start < 8000
    assert chunks[-1].samples.shape[0] == 8000


# --- item 13: parsing, languages and joining ------------------------------------------------------
def test_head_without_language_prefix_is_not_a_language() -> None:
    assert parse_asr_output("English<asr_text>hello") == ParsedOutput(None, "hello")


def test_language_names_are_capitalised() -> None:
    assert parse_asr_output("language ENGLISH<asr_text>hi").language == "English"


def test_language_none_is_matched_anywhere_in_the_head() -> None:
    assert parse_asr_output("language None English<asr_text>hi") == ParsedOutput(None, "hi")


def test_text_is_not_cut_at_an_assistant_line() -> None:
    parsed = parse_asr_output("language English<asr_text>the assistant\nsaid so")
    assert parsed == ParsedOutput("English", "the assistant\nsaid so")


def test_forced_language_output_is_all_text() -> None:
    assert parse_asr_output("language German<asr_text>x", forced_language="English") == \
        ParsedOutput("English", "language German<asr_text>x")


def test_chunk_texts_join_with_nothing_and_languages_merge_consecutively() -> None:
    parts = [ParsedOutput("English", "Hello"), ParsedOutput("English", "world"),
             ParsedOutput("Chinese", "你好"), ParsedOutput("English", "again")]
    joined = join_results(parts)
    assert joined.text == "Helloworld你好again"
    assert joined.language == "English,Chinese,English"
    assert merge_languages([None, "", None]) is None


def test_forced_language_is_normalised_or_refused_on_every_path(tiny_loaded) -> None:
    from ncnnport.models.qwen3_asr.reference import transcribe

    model, processor = tiny_loaded
    wave = speech_like(1.0)
    result = transcribe(model, processor, wave, language="eNGLISH", max_new_tokens=4)
    assert result.language == "English"
    with pytest.raises(ValueError, match="unsupported language 'En'"):
        transcribe(model, processor, wave, language="en", max_new_tokens=4)


# --- item 15: run / input validation before any model load ------------------------------------------
def _run_args(audio: Path, **kw) -> Namespace:
    return Namespace(audio=audio, language=kw.get("language"), max_new_tokens=kw.get("max_new_tokens", 8),
                     max_chunk_seconds=kw.get("max_chunk_seconds"))


def _bad_inputs(tmp_path: Path) -> dict[str, Path]:
    empty = tmp_path / "empty.wav"
    sf.write(str(empty), np.zeros((0,), np.float32), 16000)
    junk = tmp_path / "junk.wav"
    junk.write_text("not audio")
    folder = tmp_path / "dir.wav"
    folder.mkdir()
    return {"missing": tmp_path / "absent.wav", "directory": folder, "undecodable": junk, "empty": empty}


@pytest.mark.parametrize("kind", ["missing", "directory", "undecodable", "empty"])
def test_validate_run_args_names_the_bad_file(tmp_path, kind) -> None:
    path = _bad_inputs(tmp_path)[kind]
    with pytest.raises(ValueError, match=path.name):
        PORT.validate_run_args(_run_args(path))
    with pytest.raises(ValueError, match=path.name):
        PORT.validate_inputs([path])


def test_validate_run_args_refuses_a_language_code_and_accepts_good_input(tmp_path) -> None:
    good = tmp_path / "ok.wav"
    sf.write(str(good), speech_like(0.3), 16000)
    PORT.validate_run_args(_run_args(good, language="english"))
    PORT.validate_inputs([good])
    with pytest.raises(ValueError, match="--language 'en'"):
        PORT.validate_run_args(_run_args(good, language="en"))


# --- item 14: the official reference ---------------------------------------------------------------
def test_token_distance_names_the_first_differing_step() -> None:
    assert official_ref.token_distance([1, 2, 3], [1, 2, 3]).equal
    assert official_ref.token_distance([1, 2, 3], [1, 5, 3]).first_diff == 1
    assert official_ref.token_distance([1, 2], [1, 2, 3]).first_diff == 2


def test_official_reference_is_skipped_without_the_official_venv(monkeypatch) -> None:
    monkeypatch.delenv(official_ref.OFFICIAL_PYTHON_ENV, raising=False)
    (row,) = PORT.official_reference({"a": np.zeros(16000, np.float32)}, loaded=None)
    assert row["skipped"] and official_ref.OFFICIAL_PYTHON_ENV in row["reason"]


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get(official_ref.OFFICIAL_PYTHON_ENV), reason="official qwen-asr venv not configured")
def test_official_package_loads_our_official_folder_and_matches_the_reference(tiny_folder) -> None:
    loaded = PORT.load("tiny", tiny_folder)
    rows = PORT.official_reference({"speech_2s": speech_like(2.0, seed=1)}, loaded=loaded, max_new_tokens=16)
    (row,) = rows
    assert row["official_chunks"] == 1
    assert row["tokens_equal"], row
