"""The official long-audio cut rule, per-chunk joining and output parsing."""

from __future__ import annotations

import random

import numpy as np
import pytest
from transformers.models.qwen3_asr.processing_qwen3_asr import _detect_and_fix_repetitions, _parse_single_output

from ncnnport.models.qwen3_asr.chunking import (
    ParsedOutput,
    find_quiet_cut,
    split_points,
    fix_repetitions,
    join_results,
    join_texts,
    merge_languages,
    parse_asr_output,
    split_audio,
)

SR = 16000


def noise(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.RandomState(seed)
    n = int(seconds * SR)
    return ((0.3 + 0.2 * rng.rand(n)) * rng.choice([-1, 1], n)).astype(np.float32)


def plant_quiet(x: np.ndarray, at_s: float, lowest_offset: int) -> int:
    """A 100 ms stretch of small values at ``at_s`` with one smallest sample; returns its index."""
    a = int(at_s * SR)
    x[a : a + 1600] = 0.01 * np.sign(x[a : a + 1600])
    x[a + lowest_offset] = 1e-5
    return a + lowest_offset


def test_short_audio_is_one_pass() -> None:
    x = noise(30.0, 0)
    chunks = split_audio(x, max_seconds=1200)
    assert len(chunks) == 1 and chunks[0].start == 0 and chunks[0].end == x.size
    np.testing.assert_array_equal(chunks[0].samples, x)


def test_cuts_land_at_planted_quiet_spots_and_tile_exactly() -> None:
    x = noise(65.0, 1)
    # limit 20 s: cuts searched in 20 +- 5 s, then (cut1 + 20) +- 5 s, ...
    want1 = plant_quiet(x, 16.3, 777)
    want2 = plant_quiet(x, (want1 / SR) + 23.0, 1234)
    chunks = split_audio(x, max_seconds=20.0)
    cuts = [c.start for c in chunks[1:]]
    assert cuts[:2] == [want1, want2]
    assert all(b.start == a.end for a, b in zip(chunks, chunks[1:]))
    rebuilt = np.concatenate([c.samples[: c.end - c.start] for c in chunks])
    np.testing.assert_array_equal(rebuilt, x)
    assert all(c.num_padded == 0 for c in chunks)
    assert all(c.end - c.start <= 25 * SR for c in chunks)


def test_quiet_window_beats_single_quiet_sample() -> None:
    """The 100 ms window with the lowest sum wins over a lone zero sample elsewhere."""
    x = noise(12.0, 2)
    lone = int(9.0 * SR)
    x[lone] = 0.0
    want = plant_quiet(x, 11.0, 50)
    assert find_quiet_cut(x, 0, 10 * SR, 5 * SR, 1600) == want


def test_short_tail_zero_padded() -> None:
    x = noise(20.3, 3)
    want = plant_quiet(x, 20.05, 100)  # leaves a tail of ~0.24 s
    chunks = split_audio(x, max_seconds=20.0)
    assert [c.start for c in chunks] == [0, want]
    tail = chunks[-1]
    assert tail.end - tail.start < SR // 2
    assert tail.samples.shape[0] == SR // 2 and tail.num_padded == SR // 2 - (tail.end - tail.start)
    np.testing.assert_array_equal(tail.samples[: tail.end - tail.start], x[want:])
    assert not tail.samples[tail.end - tail.start :].any()


def test_uncut_tiny_input_not_padded_and_empty_rejected() -> None:
    # official: an input within the one-pass limit is returned before the 0.5 s padding step
    (only,) = split_audio(np.array([0.25], np.float32))
    assert only.samples.shape[0] == 1 and only.samples[0] == np.float32(0.25) and only.num_padded == 0
    with pytest.raises(ValueError):
        split_audio(np.zeros(0, np.float32))


def _random_texts(n: int, seed: int):
    rng = random.Random(seed)
    for _ in range(n):
        alphabet = rng.choice(["ab", "abc", "a b", "xyz ", "ab你"])
        parts = []
        for _ in range(rng.randint(0, 6)):
            if rng.random() < 0.5:
                parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10))))
            else:
                parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) * rng.randint(1, 45))
        yield "".join(parts)


def test_repetition_fixer_agrees_with_official_port() -> None:
    texts = list(_random_texts(1500, 0))
    assert sum(fix_repetitions(t) != t for t in texts) > 100  # the fixer actually fires
    for t in texts:
        assert fix_repetitions(t) == _detect_and_fix_repetitions(t), t
    assert fix_repetitions("ha" * 30 + " ok") == "ha ok"
    assert fix_repetitions("a" * 21) == "a" and fix_repetitions("a" * 20) == "a" * 20


def test_parse_agrees_with_processor() -> None:
    # prefixes on which transformers' parser and the official one agree; where they differ
    # (an "assistant" echo, a head without "language ") the official rule is tested in
    # test_qwen3_asr_fidelity.py
    prefixes = ["language English<asr_text>", "language None<asr_text>", "", "\n\nlanguage French\n<asr_text>"]
    for t in _random_texts(300, 1):
        for pre in prefixes:
            ref = _parse_single_output(pre + t)
            got = parse_asr_output(pre + t)
            assert (got.language, got.text) == (ref["language"], ref["transcription"])
    assert parse_asr_output("language English<asr_text> hello there") == ParsedOutput("English", "hello there")


def test_join() -> None:
    # official: texts concatenated with "", only consecutive duplicate languages merged
    assert join_texts(["hello world", " and more", "", "今天", "天气", "end"]) == "hello world and more今天天气end"
    assert join_texts(["Hello", "world"]) == "Helloworld"
    assert merge_languages(["English", None, "Chinese", "English"]) == "English,Chinese,English"
    assert merge_languages(["English", "English", None, "English"]) == "English"
    assert merge_languages([None, None]) is None
    joined = join_results([ParsedOutput("Chinese", "你好" * 15), ParsedOutput("Chinese", "你好" * 15)])
    assert joined == ParsedOutput("Chinese", "你好" * 30)  # the joined text is not cleaned again


def test_quiet_window_is_at_least_four_samples_as_official() -> None:
    """The official window is max(4, int(ms * sr)): a 1-sample setting still sums 4 samples, so a
    lone zero loses to a quieter 4-sample run (a 1-sample window would take the lone zero)."""
    x = np.full(40, 1.0, dtype=np.float32)
    x[10] = 0.0                      # lone zero: 4-window sum >= 3
    x[20:24] = [0.5, 0.1, 0.5, 0.5]  # 4-window sum 1.6, lowest sample at 21
    assert split_points(40, x, sr=1, max_seconds=16, search_seconds=30, window_seconds=1.0)[1] == 21
    assert split_points(40, x, sr=1, max_seconds=16, search_seconds=30, window_seconds=0.25)[1] == 21


def test_search_span_starts_at_the_previous_cut_as_official() -> None:
    """left = max(start, cut - expand): with the search wider than a chunk, the span reaches back
    to the previous cut itself (not one sample after it); a boundary there moves to start + 1."""
    x = np.full(30, 1.0, dtype=np.float32)
    x[0:4] = 0.0  # the quietest window is the very first one
    assert find_quiet_cut(x, 0, 10, 20, 4) == 1


def test_span_no_longer_than_a_window_cuts_at_the_target() -> None:
    x = np.linspace(1.0, 0.0, 12, dtype=np.float32)
    assert find_quiet_cut(x, 0, 10, 2, 4) == 10  # span [8, 12) holds 4 samples: cut at 10


def test_lengths_are_truncated_as_official() -> None:
    """max_len = int(max_seconds * sr): 2.9999 s at 10 Hz is 29 samples, not round's 30."""
    x = np.ones(40, dtype=np.float32)
    bounds = split_points(40, x, sr=10, max_seconds=2.9999, search_seconds=0.0, window_seconds=0.4)
    assert bounds[:2] == [0, 29]
