"""The official long-audio rule of Qwen3-ASR, and the joining/parsing of per-chunk outputs.

Why: public ncnn ports cut audio into short fixed windows with overlap and de-duplicate words,
which is not what the model was evaluated with. The official ``transcribe()`` (qwen-asr 0.0.6)
feeds up to 1200 s in ONE pass (the encoder's windowed attention handles length) and only cuts
longer audio, near every 1200 s, at the quietest spot within +-5 s: the 100 ms window with the
lowest sum of |x|, cut at the lowest-|x| sample inside it. Chunks tile the input exactly (no
overlap, no gap); a chunk shorter than 0.5 s is zero-padded at its tail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

SAMPLE_RATE = 16000
MAX_ASR_INPUT_SECONDS = 1200.0
MIN_ASR_INPUT_SECONDS = 0.5
SEARCH_SECONDS = 5.0
QUIET_WINDOW_SECONDS = 0.1
REPETITION_THRESHOLD = 20
ASR_TEXT_MARKER = "<asr_text>"


@dataclass(frozen=True)
class Chunk:
    """``samples`` (zero-padded to the minimum if short) of input range [start, end)."""

    start: int
    end: int
    samples: np.ndarray

    @property
    def num_padded(self) -> int:
        return int(self.samples.shape[0] - (self.end - self.start))


def find_quiet_cut(wave: np.ndarray, target: int, search: int, window: int) -> int:
    """Cut index near ``target``: in [target - search, target + search] (clipped to the signal),
    take the ``window``-sample span with the lowest sum of |x| (first one on ties), then the
    lowest-|x| sample inside it (first one on ties)."""
    n = wave.shape[0]
    lo = max(0, target - search)
    hi = min(n, target + search)
    mag = np.abs(np.asarray(wave[lo:hi], dtype=np.float64))
    win = max(1, min(window, mag.shape[0]))
    csum = np.concatenate(([0.0], np.cumsum(mag)))
    sums = csum[win:] - csum[:-win]
    start = int(np.argmin(sums))
    return lo + start + int(np.argmin(mag[start : start + win]))


def split_points(
    num_samples: int,
    wave: np.ndarray,
    sr: int = SAMPLE_RATE,
    max_seconds: float = MAX_ASR_INPUT_SECONDS,
    search_seconds: float = SEARCH_SECONDS,
    window_seconds: float = QUIET_WINDOW_SECONDS,
) -> list[int]:
    """Boundaries [0, c1, ..., n]: one pass if n <= max, else a quiet cut near each max from the
    previous cut."""
    max_len = int(round(max_seconds * sr))
    if max_len <= 0:
        raise ValueError(f"max_seconds must be positive, got {max_seconds}")
    search = int(round(search_seconds * sr))
    window = max(1, int(round(window_seconds * sr)))
    bounds = [0]
    start = 0
    while num_samples - start > max_len:
        cut = find_quiet_cut(wave, start + max_len, min(search, max_len - 1), window)
        cut = min(max(cut, start + 1), num_samples - 1)  # always progress, never an empty chunk
        bounds.append(cut)
        start = cut
    bounds.append(num_samples)
    return bounds


def split_audio(
    wave: np.ndarray,
    sr: int = SAMPLE_RATE,
    max_seconds: float = MAX_ASR_INPUT_SECONDS,
    min_seconds: float = MIN_ASR_INPUT_SECONDS,
    search_seconds: float = SEARCH_SECONDS,
    window_seconds: float = QUIET_WINDOW_SECONDS,
) -> list[Chunk]:
    """Cut a mono waveform by the official rule; short chunks are zero-padded to ``min_seconds``."""
    x = np.asarray(wave, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"expected mono [samples], got shape {x.shape}")
    if x.shape[0] == 0:
        raise ValueError("audio is empty")
    bounds = split_points(x.shape[0], x, sr, max_seconds, search_seconds, window_seconds)
    min_len = int(round(min_seconds * sr))
    chunks = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        seg = x[a:b]
        if seg.shape[0] < min_len:
            seg = np.concatenate([seg, np.zeros(min_len - seg.shape[0], dtype=np.float32)])
        chunks.append(Chunk(start=a, end=b, samples=seg))
    return chunks


# ----------------------------------------------------------------------------------- outputs


def _collapse_char_runs(text: str, threshold: int) -> str:
    """A character repeated more than ``threshold`` times in a row is kept once."""
    return re.sub(r"(.)\1{%d,}" % threshold, r"\1", text, flags=re.DOTALL)


def _collapse_pattern_repeat(text: str, threshold: int, max_len: int = 20) -> str:
    """Scanning left to right, the first position where a pattern of 1..max_len chars repeats
    at least ``threshold`` times back to back: keep one copy, drop all its repeats, and clean the
    rest of the text the same way. Text shorter than 2*threshold is left alone."""
    n = len(text)
    if n < 2 * threshold:
        return text
    for i in range(0, n - 2 * threshold + 1):
        for k in range(1, max_len + 1):
            if i + k * threshold > n:
                break
            pattern = text[i : i + k]
            if all(text[i + r * k : i + (r + 1) * k] == pattern for r in range(1, threshold)):
                end = i + threshold * k
                while end + k <= n and text[end : end + k] == pattern:
                    end += k
                return text[:i] + pattern + _collapse_pattern_repeat(text[end:], threshold, max_len)
    return text


def fix_repetitions(text: str, threshold: int = REPETITION_THRESHOLD) -> str:
    """The official runaway-repeat cleaner: long single-character runs, then repeated patterns."""
    return _collapse_pattern_repeat(_collapse_char_runs(text, threshold), threshold)


@dataclass(frozen=True)
class ParsedOutput:
    language: str | None
    text: str


def parse_asr_output(raw: str, threshold: int = REPETITION_THRESHOLD) -> ParsedOutput:
    """Parse decoded model output "language X<asr_text>text" (special tokens already skipped).

    Without the marker the whole string is the text; "language None" means no speech.
    """
    if raw is None or not raw.strip():
        return ParsedOutput(None, "")
    text = raw.strip()
    if "assistant\n" in text:
        text = text.split("assistant\n", 1)[1]
    text = fix_repetitions(text, threshold)
    if ASR_TEXT_MARKER not in text:
        return ParsedOutput(None, text.strip())
    head, body = text.split(ASR_TEXT_MARKER, 1)
    head = head.strip()
    if head.lower() == "language none":  # the model's "no speech" answer
        return ParsedOutput(None, body.strip())
    language = None
    for line in head.splitlines():
        line = line.strip()
        if not line:
            continue
        language = line[len("language ") :].strip() if line.lower().startswith("language ") else line
        break
    return ParsedOutput(language or None, body.strip())


def _needs_space(left: str, right: str) -> bool:
    if not left or not right:
        return False
    a, b = left[-1], right[0]
    if a.isspace() or b.isspace():
        return False
    # Scripts written without spaces (CJK, kana, Thai) are joined directly.
    def spaced(ch: str) -> bool:
        return not ("\u2e80" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af" or "\u0e00" <= ch <= "\u0e7f"
                    or "\uf900" <= ch <= "\ufaff" or "\u3000" <= ch <= "\u303f" or "\uff00" <= ch <= "\uffef")
    return spaced(a) and spaced(b)


def join_texts(texts: list[str]) -> str:
    """Concatenate per-chunk texts in order, with a space only between space-delimited scripts."""
    out = ""
    for t in texts:
        t = t.strip()
        if not t:
            continue
        out = out + (" " if _needs_space(out, t) else "") + t
    return out


def merge_languages(languages: list[str | None]) -> str | None:
    """Distinct detected languages in first-seen order, comma separated; None if none detected."""
    seen: list[str] = []
    for lang in languages:
        if lang and lang not in seen:
            seen.append(lang)
    return ",".join(seen) if seen else None


def join_results(parsed: list[ParsedOutput], threshold: int = REPETITION_THRESHOLD) -> ParsedOutput:
    """Per-chunk results -> one: texts joined (then cleaned of runaway repeats), languages merged."""
    text = fix_repetitions(join_texts([p.text for p in parsed]), threshold)
    return ParsedOutput(merge_languages([p.language for p in parsed]), text)
