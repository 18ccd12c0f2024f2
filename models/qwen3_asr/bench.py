"""Bench stages for Qwen3-ASR: the audio encoder on N seconds, one decode step at cache P.

Each factory returns a zero-argument callable with fixed inputs, so repeated calls must return
bit-identical outputs; the torch factories time transformers' own eager modules on the same
work for the speed ratio.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ncnnport.models.qwen3_asr import specs
from ncnnport.models.qwen3_asr.features import extract_features
from ncnnport.models.qwen3_asr.fixtures import synth_speechlike
from ncnnport.runtime import masks, rope

STAGES: dict[str, list[str]] = {"audio_encoder": ["2", "10"], "decode": ["16", "512"]}


def _seconds(size: str) -> float:
    return float(size.rstrip("s"))


def ncnn_call(model: Any, modules: Mapping[str, Any], stage: str, size: str) -> Callable[[], list[np.ndarray]]:
    from ncnnport.models.qwen3_asr.runtime import make_pipeline

    if stage == "audio_encoder":
        pipe = make_pipeline(modules, model)
        feats = extract_features(synth_speechlike(_seconds(size), seed=5))
        return lambda: [pipe.encode(feats.features, feats.mask)["audio_embeds"]]
    if stage == "decode":
        inputs = decode_inputs(model, int(size))
        layers = [modules[n] for n in specs.layer_names(specs.dims(model))["decode"]]

        def step() -> list[np.ndarray]:
            h = inputs[0]
            for i, layer in enumerate(layers):
                h = layer.run([h, *inputs[1:4], inputs[4 + 2 * i], inputs[5 + 2 * i]])[0]
            return [h]
        return step
    raise ValueError(f"qwen3-asr: no bench stage {stage!r}")


def decode_inputs(model: Any, past: int, seed: int = 0) -> list[np.ndarray]:
    """Decode-graph inputs at cache length ``past`` (random cache, real RoPE and mask)."""
    d = specs.dims(model)
    rng = np.random.default_rng(seed)
    cos, sin = rope.cos_sin(np.array([past]), rope.inv_freq(d["head_dim"], d["rope_theta"]))
    kv = [rng.standard_normal((1, d["kv_heads"], past, d["head_dim"])).astype(np.float32)
          for _ in range(2 * d["layers"])]
    emb = rng.standard_normal((1, 1, d["hidden"])).astype(np.float32)
    return [emb, cos[None], sin[None], masks.causal(1, past), *kv]


def torch_decode_call(model: Any, past: int) -> Callable[[], list[np.ndarray]]:
    """transformers' eager text decoder: one token on a DynamicCache of ``past`` entries,
    cropped back after each call so every call does the same work."""
    import torch
    from transformers import DynamicCache

    lm = model.model.language_model
    d = specs.dims(model)
    g = torch.Generator().manual_seed(0)
    cache = DynamicCache(config=lm.config)
    with torch.no_grad():
        prefix = torch.randn(1, past, d["hidden"], generator=g)
        lm(inputs_embeds=prefix, cache=cache, use_cache=True)
    token = torch.randn(1, 1, d["hidden"], generator=g)
    position = torch.tensor([[past]])

    def call() -> list[np.ndarray]:
        with torch.no_grad():
            out = lm(inputs_embeds=token, cache=cache, position_ids=position, use_cache=True)
        cache.crop(-1)  # drop the token just added: every call decodes at the same position
        return [out.last_hidden_state.numpy()]
    return call
