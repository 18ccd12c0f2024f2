"""Bench stages for Qwen3-ASR: the audio encoder on N seconds, one decode step at cache P.

Each factory returns a zero-argument callable with fixed inputs, so repeated calls must return
bit-identical outputs; the torch factories time transformers' own eager modules on the same
work for the speed ratio. ``token`` is one whole generated token: embed + every decode layer +
final norm + the tied head (the head's 151936 x 1024 table dominates at real size).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ncnnport.models.qwen3_asr import specs
from ncnnport.models.qwen3_asr.features import extract_features
from ncnnport.models.qwen3_asr.fixtures import synth_speechlike
from ncnnport.runtime import masks, rope

STAGES: dict[str, list[str]] = {"audio_encoder": ["2", "10"], "decode": ["16", "512"], "token": ["100", "1000"]}
# The speed table of `make bench-perf`: a whole token (embed row + every decode layer + final
# norm + tied head) and the decode layers alone, at positions ~100 and ~1000.
PERF_STAGES: dict[str, list[str]] = {"token": ["100", "1000"], "decode": ["100", "1000"]}


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
    if stage == "token":
        past = int(size)
        inputs = decode_inputs(model, past)
        d = specs.dims(model)
        layers = [modules[n] for n in specs.layer_names(d)["decode"]]
        ids = np.array([[11]], dtype=np.int32)

        def token() -> list[np.ndarray]:
            (h,) = modules["embed"].run([ids])
            for i, layer in enumerate(layers):
                h = layer.run([h, *inputs[1:4], inputs[4 + 2 * i], inputs[5 + 2 * i]])[0]
            (logits,) = modules["lm_head"].run([np.ascontiguousarray(h.reshape(1, 1, -1))])
            return [logits]
        return token
    raise ValueError(f"qwen3-asr: no bench stage {stage!r}")


def stage_bytes(model: Any, stage: str, size: str) -> dict[str, int] | None:
    """Bytes one call must read at least: weights of the graphs it runs, and the K/V cache."""
    d = specs.dims(model)
    w = specs.module_weight_bytes(model)
    if stage not in ("decode", "token"):
        return None
    weights = sum(w[n] for n in specs.layer_names(d)["decode"])
    if stage == "token":
        weights += w["lm_head"] + 4 * d["hidden"]  # the head table + one embedding row
    kv = 2 * d["layers"] * d["kv_heads"] * int(size) * d["head_dim"] * 4
    return {"weights": weights, "kv_cache": kv}


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


def torch_token_call(model: Any, past: int) -> Callable[[], list[np.ndarray]]:
    """One whole generated token in transformers eager: embedding lookup, the decoder on a
    DynamicCache of ``past`` entries (cropped back after each call), final norm and lm_head."""
    import torch
    from transformers import DynamicCache

    lm = model.model.language_model
    head = model.lm_head
    d = specs.dims(model)
    g = torch.Generator().manual_seed(0)
    cache = DynamicCache(config=lm.config)
    with torch.no_grad():
        lm(inputs_embeds=torch.randn(1, past, d["hidden"], generator=g), cache=cache, use_cache=True)
    ids = torch.tensor([[11]])
    position = torch.tensor([[past]])

    def call() -> list[np.ndarray]:
        with torch.no_grad():
            out = lm(input_ids=ids, cache=cache, position_ids=position, use_cache=True)
            logits = head(out.last_hidden_state)
        cache.crop(-1)
        return [logits.numpy()]
    return call
