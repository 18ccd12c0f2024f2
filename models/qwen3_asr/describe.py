"""What a Qwen3-ASR package needs to run without torch or transformers, read from the reference
at convert time (``model.json``), and the packaged e2e cases with the reference's token ids.

The prompt is the checkpoint's chat template rendered by its processor with one unexpanded
audio placeholder: the text before and after it, the forced-language prefill rule and their
token ids are stored, and :func:`check_prompt_pieces` proves at convert time that the pieces
rebuild the processor's own ids (with and without a forced language) through ``tokenizers``
alone, so the package never carries a prompt the processor would not have made.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ncnnport.models.qwen3_asr import features
from ncnnport.models.qwen3_asr.chunking import MAX_ASR_INPUT_SECONDS
from ncnnport.package.cases import PackageCase

TOKENIZER_FILE = "assets/processor/tokenizer.json"
PROBE_LANGUAGE = "English"


def prompt_pieces(processor: Any) -> dict[str, Any]:
    """Prefix / suffix text around the audio placeholder and the forced-language prefill rule,
    rendered by the processor's own template (unexpanded: one ``<|audio_pad|>``)."""
    probe = np.zeros(features.SAMPLE_RATE, np.float32)
    plain = processor.apply_transcription_request(probe, tokenize=False)[0]
    forced = processor.apply_transcription_request(probe, language=PROBE_LANGUAGE, tokenize=False)[0]
    token = processor.audio_token
    if plain.count(token) != 1 or not forced.startswith(plain):
        raise RuntimeError(f"qwen3-asr: the chat template's prompt {plain!r} is not prefix + {token} + suffix "
                           "followed by the language prefill; model.json cannot describe it")
    prefix, suffix = plain.split(token)
    prefill = forced[len(plain):]
    if prefill.count(PROBE_LANGUAGE) != 1:
        raise RuntimeError(f"qwen3-asr: language prefill {prefill!r} does not name the language once")
    tok = processor.tokenizer
    return {"prefix_text": prefix, "suffix_text": suffix, "audio_token": token,
            "language_prefill": prefill.replace(PROBE_LANGUAGE, "{language}"),
            "prefix_ids": tok.encode(prefix, add_special_tokens=False),
            "suffix_ids": tok.encode(suffix, add_special_tokens=False)}


def describe(model: Any, processor: Any, dims: dict[str, Any]) -> dict[str, Any]:
    """The ``model.json`` body: dims, special and eos ids, RoPE rule, prompt pieces, generation
    defaults and the log-mel constants (the runtime refuses a package whose constants differ
    from its own feature code)."""
    cfg = model.config
    eos = model.generation_config.eos_token_id
    eos = cfg.eos_token_id if eos is None else eos
    fe = processor.feature_extractor
    rope = dict(cfg.text_config.rope_parameters)
    return {
        "dims": dims,
        "special_ids": {"audio_token_id": int(cfg.audio_token_id),
                        "eos_ids": [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]},
        "audio": {"n_window": int(cfg.audio_config.n_window), "n_window_infer": int(cfg.audio_config.n_window_infer)},
        "rope": {"theta": float(rope["rope_theta"]), "type": str(rope.get("rope_type", "default")),
                 "rule": "inv_freq = 1 / theta^(2i/head_dim); angle = float32(position) * inv_freq; "
                         "cos/sin of the angles repeated twice along head_dim (rotate_half)",
                 "parameters": {k: v for k, v in rope.items() if isinstance(v, (int, float, str, list))}},
        "max_positions": int(dims["max_positions"]),
        "prompt": prompt_pieces(processor),
        "generation": {"decoding": "greedy", "max_new_tokens": 256, "max_chunk_seconds": MAX_ASR_INPUT_SECONDS,
                       "skip_special_tokens": True},
        "preprocessing": {"sample_rate": int(fe.sampling_rate), "n_fft": int(fe.n_fft), "hop_length": int(fe.hop_length),
                          "n_mels": int(fe.feature_size), "n_window": int(fe.n_window),
                          "log_floor_db": features.LOG_FLOOR_DB, "dither": float(fe.dither)},
        "files": {"tokenizer": TOKENIZER_FILE},
    }


def wav_bytes(wave: np.ndarray, sr: int = features.SAMPLE_RATE) -> bytes:
    """``wave`` as a float32 WAV file (exact samples)."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.asarray(wave, np.float32), sr, format="WAV", subtype="FLOAT")
    return buf.getvalue()


# (case name, seconds, seed, forced language, new tokens): short enough for the tiny preset's
# greedy decode to match transformers token for token (the parity gate checks 64)
CASES = (("speech_2s", 2.0, 3, None, 24), ("speech_5s_english", 5.0, 4, "English", 24))


def package_cases(model: Any, processor: Any) -> list[PackageCase]:
    """Two e2e cases: a synthetic clip as WAV and the reference's greedy token ids per chunk,
    computed on the file as ``run`` reads it (``read_audio``: resampling and range rules)."""
    from ncnnport.models.qwen3_asr.audio import read_audio
    from ncnnport.models.qwen3_asr.fixtures import synth_speechlike
    from ncnnport.models.qwen3_asr.reference import transcribe

    out = []
    for name, seconds, seed, language, n in CASES:
        data = wav_bytes(synth_speechlike(seconds, seed))
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "input.wav").write_bytes(data)
            wave = read_audio(Path(tmp) / "input.wav")
        ref = transcribe(model, processor, wave, language=language, max_new_tokens=n)
        out.append(PackageCase(name, {"input.wav": data}, {"audio": "input.wav"},
                               expected={"token_ids": [list(map(int, c.token_ids)) for c in ref.chunks],
                                         "language": ref.language, "text": ref.text},
                               args={"language": language, "max_new_tokens": n}))
    return out
