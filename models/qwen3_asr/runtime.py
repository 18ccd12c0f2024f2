"""End-to-end transcription with the ported graphs: audio -> chunks -> features -> encoder ->
prompt -> greedy decode -> parsed language and text. Backend-agnostic (runners in, text out)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from ncnnport.models.qwen3_asr import specs
from ncnnport.models.qwen3_asr.chunking import (MAX_ASR_INPUT_SECONDS, Chunk, ParsedOutput, join_results,
                                               normalize_forced_language, parse_asr_output, split_audio)
from ncnnport.models.qwen3_asr.features import SAMPLE_RATE, extract_features
from ncnnport.models.qwen3_asr.pipeline import Generation, Qwen3ASRPipeline
from ncnnport.models.qwen3_asr.prompt import build_prompt


def make_pipeline(modules: Mapping[str, Any], model: Any) -> Qwen3ASRPipeline:
    cfg = model.config
    eos = model.generation_config.eos_token_id if model.generation_config.eos_token_id is not None \
        else cfg.eos_token_id
    eos = list(eos) if isinstance(eos, (list, tuple)) else [eos]
    return Qwen3ASRPipeline(modules, specs.dims(model), audio_token_id=cfg.audio_token_id, eos_ids=eos,
                            n_window_infer=cfg.audio_config.n_window_infer)


@dataclass
class ChunkRun:
    chunk: Chunk
    input_ids: np.ndarray
    features: np.ndarray
    mask: np.ndarray
    encoded: dict[str, np.ndarray]
    generation: Generation
    parsed: ParsedOutput


@dataclass
class Transcript:
    language: str | None
    text: str
    chunks: list[ChunkRun] = field(default_factory=list)


def transcribe(pipeline: Qwen3ASRPipeline, processor: Any, wave16k: np.ndarray, *, language: str | None = None,
               max_new_tokens: int = 256, max_chunk_seconds: float = MAX_ASR_INPUT_SECONDS,
               min_new_tokens: int = 0, keep_logits: bool = False,
               on_token: Callable[[int], None] | None = None) -> Transcript:
    """Official ``transcribe()`` flow on the port: cut rule, per-chunk greedy decode, official
    parsing (a forced language is canonicalised and validated first, then reported as is) and
    joining."""
    language = normalize_forced_language(language)
    runs = []
    for chunk in split_audio(np.asarray(wave16k, np.float32), SAMPLE_RATE, max_seconds=max_chunk_seconds):
        feats = extract_features(chunk.samples)
        prompt = build_prompt(processor, chunk.samples, language=language)
        encoded = pipeline.encode(feats.features, feats.mask)
        gen = pipeline.generate(prompt.input_ids, encoded["audio_embeds"], max_new_tokens,
                                keep_logits=keep_logits, on_token=on_token, min_new_tokens=min_new_tokens)
        raw = processor.tokenizer.decode(gen.tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        runs.append(ChunkRun(chunk, prompt.input_ids, feats.features, feats.mask, encoded, gen,
                             parse_asr_output(raw, forced_language=language)))
    joined = join_results([r.parsed for r in runs])
    return Transcript(joined.language, joined.text, runs)
