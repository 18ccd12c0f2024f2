"""Qwen3-ASR from its package alone: graphs, ``model.json`` and ``tokenizer.json``; neither
torch nor transformers is imported (``ncnnport run qwen3-asr --package``, ``ncnnport verify``).

The flow is the one of ``runtime.transcribe`` (official cut rule, numpy log-mel, per-chunk
greedy decode, official parsing and joining); only the two processor calls are replaced: the
prompt ids come from the packaged template pieces through ``tokenizers``, and the decoded text
from the same tokenizer (``skip_special_tokens``, no clean-up, as the processor is called).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ncnnport.models.qwen3_asr import features
from ncnnport.models.qwen3_asr.chunking import (join_results, normalize_forced_language, parse_asr_output,
                                               split_audio)
from ncnnport.models.qwen3_asr.pipeline import Qwen3ASRPipeline
from ncnnport.models.qwen3_asr.prompt import audio_token_count
from ncnnport.package.model_json import DEFAULT_PRECISION, PackageError


def check_preprocessing(model_json: Mapping[str, Any], path: Path) -> None:
    """The package's log-mel constants must be the ones ``features`` computes with."""
    pre = model_json.get("preprocessing", {})
    ours = {"sample_rate": features.SAMPLE_RATE, "n_fft": features.N_FFT, "hop_length": features.HOP,
            "n_mels": features.N_MELS, "n_window": features.N_WINDOW, "log_floor_db": features.LOG_FLOOR_DB}
    for key, value in ours.items():
        if pre.get(key) != value:
            raise PackageError(f"{path}: field 'preprocessing.{key}' is {pre.get(key)!r}; this runtime "
                               f"computes log-mel with {value!r}")


@dataclass
class PackagedASR:
    """A package opened for transcription: the pipeline over its graphs, its tokenizer and prompt pieces."""

    pipeline: Qwen3ASRPipeline
    tokenizer: Any
    prompt: dict[str, Any]

    def prompt_ids(self, n_audio: int, language: str | None) -> np.ndarray:
        """prefix + n x audio placeholder + suffix (+ the forced-language prefill), as the
        processor tokenizes the rendered template."""
        p = self.prompt
        text = p["prefix_text"] + p["audio_token"] * n_audio + p["suffix_text"]
        if language is not None:
            text += p["language_prefill"].format(language=language)
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)


def open_packaged(package: Path, model_json: Mapping[str, Any], modules: Mapping[str, Any]) -> PackagedASR:
    """The runtime over opened ``modules`` of ``package`` described by its ``model.json``."""
    from tokenizers import Tokenizer

    path = Path(package) / "model.json"
    check_preprocessing(model_json, path)
    try:
        ids, dims, audio = model_json["special_ids"], model_json["dims"], model_json["audio"]
        audio_token_id, eos_ids, n_window_infer = ids["audio_token_id"], ids["eos_ids"], audio["n_window_infer"]
        prompt = dict(model_json["prompt"])
    except KeyError as exc:
        raise PackageError(f"{path}: field {exc.args[0]!r} missing") from None
    # the pipeline raises KeyError for a dims field or for graphs the caller did not open: the
    # message names which (a missing graph is not a missing model.json field)
    try:
        pipe = Qwen3ASRPipeline(modules, dims, audio_token_id=audio_token_id, eos_ids=eos_ids,
                                n_window_infer=n_window_infer,
                                package_precision=str(model_json.get("precision", DEFAULT_PRECISION)))
    except KeyError as exc:
        what = exc.args[0] if "modules missing" in str(exc.args[0]) else f"dims field {exc.args[0]!r} missing"
        raise PackageError(f"{path}: {what}") from None
    tokenizer = Tokenizer.from_file(str(Path(package) / model_json["files"]["tokenizer"]))
    return PackagedASR(pipe, tokenizer, prompt)


@dataclass
class PackagedTranscript:
    language: str | None
    text: str
    token_ids: list[list[int]] = field(default_factory=list)


def transcribe(asr: PackagedASR, wave16k: np.ndarray, *, language: str | None = None, max_new_tokens: int = 256,
               max_chunk_seconds: float | None = None) -> PackagedTranscript:
    """Official ``transcribe()`` flow on the packaged runtime (see ``runtime.transcribe``)."""
    from ncnnport.models.qwen3_asr.chunking import MAX_ASR_INPUT_SECONDS

    language = normalize_forced_language(language)
    parsed, tokens = [], []
    for chunk in split_audio(np.asarray(wave16k, np.float32), features.SAMPLE_RATE,
                             max_seconds=max_chunk_seconds or MAX_ASR_INPUT_SECONDS):
        feats = features.extract_features(chunk.samples)
        ids = asr.prompt_ids(audio_token_count(int(feats.mask.sum())), language)
        encoded = asr.pipeline.encode(feats.features, feats.mask)
        gen = asr.pipeline.generate(ids, encoded["audio_embeds"], max_new_tokens)
        tokens.append(list(gen.tokens))
        parsed.append(parse_asr_output(asr.decode(gen.tokens), forced_language=language))
    joined = join_results(parsed)
    return PackagedTranscript(joined.language, joined.text, tokens)


def run_case(asr: PackagedASR, case: Any) -> dict[str, Any]:
    """One packaged case on the package's loop, in the schema of ``case.expected``: token ids
    per chunk, language and text."""
    from ncnnport.models.qwen3_asr.audio import read_audio

    got = transcribe(asr, read_audio(case.inputs["audio"]), language=case.args.get("language"),
                     max_new_tokens=int(case.args.get("max_new_tokens", 256)))
    return {"token_ids": got.token_ids, "language": got.language, "text": got.text}


def compare_case(got: Mapping[str, Any], expected: Mapping[str, Any]) -> dict[str, Any]:
    """Token ids of every chunk must equal the expected ones, byte for byte."""
    got_ids, want = got["token_ids"], expected["token_ids"]
    if got_ids == want:
        return {"passed": True, "detail": f"{sum(map(len, want))} token ids equal in {len(want)} chunk(s)"}
    for i, (g, w) in enumerate(zip(got_ids, want)):
        if g != w:
            k = next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            return {"passed": False, "detail": f"chunk {i}: first differing token at {k} "
                                               f"(got {g[k:k + 3]}, reference {w[k:k + 3]}; lengths {len(g)}/{len(w)})"}
    return {"passed": False, "detail": f"{len(got_ids)} chunks, reference {len(want)}"}

