"""Tiny preset + prompt + the torch reference transcription."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from ncnnport.models.qwen3_asr.chunking import ASR_TEXT_MARKER
from ncnnport.models.qwen3_asr.features import extract_features
from ncnnport.models.qwen3_asr.presets import TINY_SPECIAL_IDS, real_config, tiny_config
from ncnnport.models.qwen3_asr.prompt import audio_token_count, build_prompt
from ncnnport.models.qwen3_asr.reference import transcribe, top2_margins

from .conftest import speech_like


def test_tiny_config_is_the_real_structure() -> None:
    tiny, real = tiny_config(), real_config()
    for cfg in (tiny, real):
        text, audio = cfg.text_config, cfg.audio_config
        assert text.model_type == "qwen3" and audio.model_type == "qwen3_asr_encoder"
        assert text.num_key_value_heads < text.num_attention_heads  # GQA
        assert audio.output_dim == text.hidden_size  # projector feeds the decoder
        assert (audio.n_window, audio.n_window_infer, audio.num_mel_bins) == (50, 800, 128)
        assert cfg.audio_token_id < text.vocab_size
    assert real.text_config.hidden_size == 1024 and real.text_config.num_hidden_layers == 28


def test_prompt_layout(tiny_loaded) -> None:
    model, processor = tiny_loaded
    wave = speech_like(3.3, seed=1)
    auto = build_prompt(processor, wave)
    forced = build_prompt(processor, wave, language="en")
    frames = extract_features(wave).num_frames
    assert auto.num_audio_tokens == audio_token_count(frames) == 43  # 3 x 13 + 4 for 30 frames
    ids = TINY_SPECIAL_IDS
    p = auto.audio_positions
    assert auto.input_ids[p[0] - 1] == ids["<|audio_start|>"] and auto.input_ids[p[-1] + 1] == ids["<|audio_end|>"]
    assert np.all(auto.input_ids[p] == model.config.audio_token_id)
    text = processor.tokenizer.decode(auto.input_ids)
    assert text.startswith("<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|audio_start|>")
    assert text.endswith("<|audio_end|><|im_end|>\n<|im_start|>assistant\n")
    # the forced language only appends "language English<asr_text>" to the same prompt
    assert np.array_equal(forced.input_ids[: auto.input_ids.size], auto.input_ids)
    assert processor.tokenizer.decode(forced.input_ids[auto.input_ids.size :]) == "language English" + ASR_TEXT_MARKER
    assert np.array_equal(forced.audio_positions, auto.audio_positions)
    ours = extract_features(wave)
    assert np.abs(ours.features - auto.input_features).max() <= 1e-5
    assert np.array_equal(ours.mask, auto.input_features_mask)


def test_greedy_tokens_vary_and_logits_explain_them(tiny_loaded) -> None:
    model, processor = tiny_loaded
    wave = speech_like(3.0, seed=2)
    result = transcribe(model, processor, wave, max_new_tokens=64, min_new_tokens=64)
    (chunk,) = result.chunks
    ids = chunk.token_ids
    assert len(ids) == 64 and chunk.logits.shape == (64, model.config.text_config.vocab_size)
    longest_run = max(len(list(g)) for _, g in itertools.groupby(ids))
    assert len(set(ids)) >= 8 and longest_run <= 16, (len(set(ids)), longest_run, ids)
    assert np.array_equal(chunk.logits.argmax(-1), np.array(ids))  # greedy: each id is its row's argmax
    assert np.all(chunk.margins >= 0) and np.allclose(chunk.margins, top2_margins(chunk.logits))
    # the logits are the model's: re-run the full sequence once and compare the last 64 rows
    full = torch.from_numpy(np.concatenate([chunk.prompt.input_ids, ids[:-1]]))[None]
    with torch.no_grad():
        out = model(
            input_ids=full,
            input_features=torch.from_numpy(chunk.prompt.input_features),
            input_features_mask=torch.from_numpy(chunk.prompt.input_features_mask).long(),
        ).logits[0, -64:]
    assert np.abs(out.numpy() - chunk.logits).max() < 1e-4


def test_long_audio_uses_the_cut_rule(tiny_loaded) -> None:
    model, processor = tiny_loaded
    wave = speech_like(2.6, seed=4)
    result = transcribe(model, processor, wave, max_new_tokens=4, max_chunk_seconds=1.2)
    assert len(result.chunks) >= 2
    assert result.chunks[0].chunk.start == 0 and result.chunks[-1].chunk.end == wave.size
    assert all(a.chunk.end == b.chunk.start for a, b in zip(result.chunks, result.chunks[1:]))
    assert all(c.prompt.input_features_mask.sum() >= 50 for c in result.chunks)  # >= 0.5 s each


def test_float64_prefill_reference_is_exact_and_leaves_the_model_unchanged(tiny_loaded) -> None:
    """The float64 logits are the same model's (close to the fp32 first step, not bit-equal:
    really computed in float64), and the in-place round trip restores every weight bit for bit."""
    from ncnnport.models.qwen3_asr.reference import greedy_generate, prefill_logits_float64

    model, processor = tiny_loaded
    before = {k: v.clone() for k, v in model.state_dict().items()}
    prompt = build_prompt(processor, speech_like(2.0, seed=3))
    _, fp32 = greedy_generate(model, prompt, 1)
    exact = prefill_logits_float64(model, prompt)
    assert exact.dtype == np.float64 and exact.shape == fp32[0].shape
    noise = np.abs(fp32[0].astype(np.float64) - exact).max()
    assert 0 < noise < 1e-4 * np.abs(exact).max()
    after = model.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
