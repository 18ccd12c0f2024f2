"""The official long-audio rule of Qwen3-ASR, and the joining/parsing of per-chunk outputs.

Why: public ncnn ports cut audio into short fixed windows with overlap and de-duplicate words,
which is not what the model was evaluated with. The official ``transcribe()`` (qwen-asr 0.0.6)
feeds up to 1200 s in ONE pass (the encoder's windowed attention handles length) and only cuts
longer audio, near every 1200 s, at the quietest spot within +-5 s: the 100 ms window with the
lowest sum of |x|, cut at the lowest-|x| sample inside it. Chunks tile the input exactly (no
overlap, no gap); when the input was cut, a chunk shorter than 0.5 s is zero-padded at its tail
(an uncut input is never padded).
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


def find_quiet_cut(wave: np.ndarray, start: int, cut: int, expand: int, window: int) -> int:
    """Boundary near ``cut`` as the official ``split_audio_into_chunks`` picks it: search
    [max(start, cut - expand), min(n, cut + expand)); if that span is not longer than one window,
    cut at ``cut``; else take the ``window``-sample span with the lowest float32 sum of |x| (a
    float32 ``np.convolve``, as official, so near-ties resolve the same way; first one on ties),
    then the lowest-|x| sample inside it (first one on ties). Never at or before ``start``."""
    n = wave.shape[0]
    left, right = max(start, cut - expand), min(n, cut + expand)
    if right - left <= window:
        boundary = cut
    else:
        mag = np.abs(np.asarray(wave[left:right], dtype=np.float32))
        sums = np.convolve(mag, np.ones(window, dtype=np.float32), mode="valid")
        first = int(np.argmin(sums))
        boundary = left + first + int(np.argmin(mag[first:first + window]))
    return int(min(max(boundary, start + 1), n))


def split_points(
    num_samples: int,
    wave: np.ndarray,
    sr: int = SAMPLE_RATE,
    max_seconds: float = MAX_ASR_INPUT_SECONDS,
    search_seconds: float = SEARCH_SECONDS,
    window_seconds: float = QUIET_WINDOW_SECONDS,
) -> list[int]:
    """Boundaries [0, c1, ..., n]: one pass if the input lasts at most ``max_seconds``, else a
    quiet cut near each ``max_len`` from the previous cut. Lengths are truncated (``int``), the
    window is at least 4 samples, as in the official rule."""
    if max_seconds <= 0:
        raise ValueError(f"max_seconds must be positive, got {max_seconds}")
    bounds = [0]
    if num_samples / float(sr) <= max_seconds:
        return bounds + [num_samples]
    max_len = max(1, int(max_seconds * sr))
    expand = int(search_seconds * sr)
    window = max(4, int(window_seconds * sr))
    start = 0
    while num_samples - start > max_len:
        start = find_quiet_cut(wave, start, start + max_len, expand, window)
        bounds.append(start)
    # A cut may fall on the very last sample's end; the official tail is then an empty chunk
    # (zero-padded to the minimum like any short chunk of a cut input).
    return bounds + [num_samples]


def split_audio(
    wave: np.ndarray,
    sr: int = SAMPLE_RATE,
    max_seconds: float = MAX_ASR_INPUT_SECONDS,
    min_seconds: float = MIN_ASR_INPUT_SECONDS,
    search_seconds: float = SEARCH_SECONDS,
    window_seconds: float = QUIET_WINDOW_SECONDS,
) -> list[Chunk]:
    """Cut a mono waveform by the official rule.

    Only the chunks of a CUT input are zero-padded to ``min_seconds``: the official
    ``split_audio_into_chunks`` returns an input of at most ``max_seconds`` unchanged before its
    padding step, so a single 0.2 s clip stays 0.2 s (20 mel frames, not 50)."""
    x = np.asarray(wave, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"expected mono [samples], got shape {x.shape}")
    if x.shape[0] == 0:
        raise ValueError("audio is empty")
    bounds = split_points(x.shape[0], x, sr, max_seconds, search_seconds, window_seconds)
    min_len = int(min_seconds * sr)
    chunks = []
    was_cut = len(bounds) > 2
    for a, b in zip(bounds[:-1], bounds[1:]):
        seg = x[a:b]
        if was_cut and seg.shape[0] < min_len:
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
    """One parsed answer: ``language`` is the canonical name ("English") or None when the model
    gave none (the official package reports that as ""), ``text`` the transcription."""

    language: str | None
    text: str


# The languages the official package accepts as a forced language (qwen-asr 0.0.6,
# inference/utils.py SUPPORTED_LANGUAGES), in its order.
SUPPORTED_LANGUAGES: tuple[str, ...] = (
    "Chinese", "English", "Cantonese", "Arabic", "German", "French", "Spanish", "Portuguese",
    "Indonesian", "Italian", "Korean", "Russian", "Thai", "Vietnamese", "Japanese", "Turkish",
    "Hindi", "Malay", "Dutch", "Swedish", "Danish", "Finnish", "Polish", "Czech", "Filipino",
    "Persian", "Greek", "Romanian", "Hungarian", "Macedonian",
)
LANGUAGE_PREFIX = "language "


def canonical_language_name(name: str) -> str:
    """First letter upper case, the rest lower case ("cHINese" -> "Chinese"), as the official
    package writes every language name it reports or forces."""
    text = str(name).strip()
    return text[:1].upper() + text[1:].lower()


def normalize_forced_language(language: str | None) -> str | None:
    """A user's forced language as the official ``transcribe()`` takes it: None or blank means
    auto-detect; anything else is canonicalised and must be a supported language name.

    Why: the official API refuses codes ("en" becomes "En", which is not supported) where
    transformers' processor maps codes to names; every path here (run, parity, reference) goes
    through this one function so they accept and report the same thing.
    """
    if language is None or not str(language).strip():
        return None
    name = canonical_language_name(language)
    if name not in SUPPORTED_LANGUAGES:
        raise ValueError(f"--language {language!r}: unsupported language {name!r}; "
                         f"supported (names, not codes): {', '.join(SUPPORTED_LANGUAGES)}")
    return name


def _language_from_head(head: str) -> str | None:
    """The first non-empty line of the part before ``<asr_text>`` names the language only when it
    starts with "language " (case-insensitive); any other first line means no language."""
    for line in head.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.lower().startswith(LANGUAGE_PREFIX):
            value = line[len(LANGUAGE_PREFIX):].strip()
            return canonical_language_name(value) if value else None
        return None
    return None


def parse_asr_output(raw: str | None, forced_language: str | None = None,
                     threshold: int = REPETITION_THRESHOLD) -> ParsedOutput:
    """Parse the decoded generated tokens (special tokens skipped) as the official package does.

    Runaway repeats are cleaned first. With a forced language the whole output is the text and
    the language is the forced one. Otherwise "language X<asr_text>text": without the marker the
    whole string is the text; "language none" anywhere before the marker means no language.
    """
    if raw is None or not str(raw).strip():
        return ParsedOutput(None, "")
    text = fix_repetitions(str(raw).strip(), threshold)
    if forced_language:
        return ParsedOutput(forced_language, text)
    if ASR_TEXT_MARKER not in text:
        return ParsedOutput(None, text.strip())
    head, body = text.split(ASR_TEXT_MARKER, 1)
    if "language none" in head.lower():  # the model's "no speech" answer
        return ParsedOutput(None, body.strip())
    return ParsedOutput(_language_from_head(head), body.strip())


def join_texts(texts: list[str]) -> str:
    """Per-chunk texts concatenated in order with nothing between them (the official join)."""
    return "".join(t for t in texts if t is not None)


def merge_languages(languages: list[str | None]) -> str | None:
    """Languages in order, comma separated, dropping empty ones and CONSECUTIVE duplicates only
    (["English", "Chinese", "English"] stays three); None if none was detected."""
    out: list[str] = []
    for lang in languages:
        lang = (lang or "").strip()
        if lang and (not out or out[-1] != lang):
            out.append(lang)
    return ",".join(out) if out else None


def join_results(parsed: list[ParsedOutput]) -> ParsedOutput:
    """Per-chunk results -> one: texts joined with "", languages merged (each chunk's text was
    already cleaned of runaway repeats when parsed; the joined text is not cleaned again)."""
    return ParsedOutput(merge_languages([p.language for p in parsed]), join_texts([p.text for p in parsed]))
