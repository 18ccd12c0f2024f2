"""The Qwen3-ASR split as module specs: one source of truth for every graph's dims and inputs."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ncnnport.contract import GraphVariant, ModuleSpec, ParamPatch, TensorSpec
from ncnnport.export.weights import beyond_layers, weight_bytes
from ncnnport.models.qwen3_asr import wrappers
from ncnnport.models.qwen3_asr.names import layer_names  # noqa: F401 - re-exported
from ncnnport.runtime import masks, rope

AUDIO_WINDOW_TRACE = (13, 104)      # one chunk, one full attention window (8 chunks x 13)
PREFILL_TRACE = (9, 23)
DECODE_TRACE = (5, 12)


def dims(model) -> dict[str, int]:
    """Every dimension the specs and the runtime need, read from the model's config once."""
    a = model.config.audio_config
    t = model.config.text_config
    return {
        "mel_bins": a.num_mel_bins, "chunk_frames": 2 * a.n_window, "d_model": a.d_model,
        "audio_out": a.output_dim, "hidden": t.hidden_size, "layers": t.num_hidden_layers,
        "heads": t.num_attention_heads, "kv_heads": t.num_key_value_heads,
        "head_dim": getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads,
        "vocab": t.vocab_size, "max_positions": t.max_position_embeddings,
        "audio_layers": a.encoder_layers,
        "rope_theta": float(t.rope_parameters["rope_theta"]),
    }


def kv_specs(d: Mapping[str, int], axis: str, prefix: str) -> list[TensorSpec]:
    out = []
    for i in range(d["layers"]):
        for kind in ("k", "v"):
            out.append(TensorSpec(f"{prefix}{kind}{i}", (1, d["kv_heads"], axis, d["head_dim"])))
    return out


def _rope_inputs(d: Mapping[str, int], start: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    return rope.span(start, length, d["head_dim"], d["rope_theta"])


def _prefill_inputs(d: Mapping[str, int]):
    def make(sizes: Mapping[str, int], rng: np.random.Generator) -> list[np.ndarray]:
        s = sizes["seq"]
        cos, sin = _rope_inputs(d, 0, s)
        h = rng.standard_normal((1, s, d["hidden"])).astype(np.float32)
        return [h, cos, sin, masks.causal(s)]
    return make


def _decode_inputs(d: Mapping[str, int], layers: int = 1):
    """Inputs of the public ports' static decode graph (3-D hidden, mask, K/V of every layer)."""
    def make(sizes: Mapping[str, int], rng: np.random.Generator) -> list[np.ndarray]:
        p = sizes["past"]
        cos, sin = _rope_inputs(d, p, 1)
        h = rng.standard_normal((1, 1, d["hidden"])).astype(np.float32)
        past = [rng.standard_normal((1, d["kv_heads"], p, d["head_dim"])).astype(np.float32)
                for _ in range(2 * layers)]
        return [h, cos, sin, masks.causal(1, p), *past]
    return make


def decode_layer_inputs(d: Mapping[str, int], past: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Inputs of one ``decode_layer{i}`` at cache length ``past``: ``h [1,H]``, RoPE of position
    ``past`` ``[1,1,hd]``, random past K/V ``[1,kv,past,hd]``."""
    cos, sin = _rope_inputs(d, past, 1)
    h = rng.standard_normal((1, d["hidden"])).astype(np.float32)
    kv = [rng.standard_normal((1, d["kv_heads"], past, d["head_dim"])).astype(np.float32) for _ in range(2)]
    return [h, cos, sin, *kv]


def _ids_inputs(d: Mapping[str, int]):
    def make(sizes: Mapping[str, int], rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.integers(0, d["vocab"], size=(1, sizes["seq"])).astype(np.int32)]
    return make


def module_specs(model) -> list[ModuleSpec]:
    """One spec per graph. ``model`` is a :class:`~.lazy.LazyQwen3ASR`: every ``build()`` reads
    only its own module's weights (``model.part(path)``) and returns a fresh wrapper, so export
    holds one layer in memory at a time (weight bytes per graph: :func:`module_weight_bytes`)."""
    d = dims(model)
    text_cfg = model.config.text_config
    H, hd, kv = d["hidden"], d["head_dim"], d["kv_heads"]
    names = layer_names(d)
    tower, text = "model.audio_tower", "model.language_model"

    def audio_conv():
        pos = model.skeleton.get_submodule(f"{tower}.positional_embedding").positional_embedding
        return wrappers.AudioConv(*(model.part(f"{tower}.{n}") for n in ("conv2d1", "conv2d2", "conv2d3", "conv_out")),
                                  pos, d["chunk_frames"]).eval()

    out = [
        ModuleSpec(
            "audio_conv", build=audio_conv,
            inputs=[TensorSpec("mel", (1, 1, d["mel_bins"], d["chunk_frames"]))],
            outputs=[TensorSpec("conv", (1, "steps", d["d_model"]))],
            weights=tuple(f"{tower}.{n}" for n in ("conv2d1", "conv2d2", "conv2d3", "conv_out")),
            notes="static: one 2*n_window-frame mel chunk; the host crops the partial last chunk"),
    ]
    for i, name in enumerate(names["audio"]):
        out.append(ModuleSpec(
            name, build=lambda i=i: wrappers.AudioLayer(model.part(f"{tower}.layers.{i}")).eval(),
            inputs=[TensorSpec("x", (1, "tokens", d["d_model"]))],
            outputs=[TensorSpec("y", (1, "tokens", d["d_model"]))],
            axes={"tokens": AUDIO_WINDOW_TRACE}, parity_sizes=[{"tokens": 1}, {"tokens": 57}],
            weights=(f"{tower}.layers.{i}",),
            notes="one encoder layer over one attention window (full attention inside it)"))
    out += [
        ModuleSpec(
            "audio_head", build=lambda: wrappers.AudioHead(model.part(f"{tower}.ln_post"),
                                                           model.part("model.multi_modal_projector")).eval(),
            inputs=[TensorSpec("x", (1, "tokens", d["d_model"]))],
            outputs=[TensorSpec("audio_embeds", (1, "tokens", d["audio_out"]))],
            axes={"tokens": AUDIO_WINDOW_TRACE}, parity_sizes=[{"tokens": 1}],
            weights=(f"{tower}.ln_post", "model.multi_modal_projector")),
        ModuleSpec(
            "embed", build=lambda: wrappers.TokenEmbed(model.part(f"{text}.embed_tokens")).eval(),
            inputs=[TensorSpec("ids", (1, "seq"), "int32")],
            outputs=[TensorSpec("emb", (1, "seq", H))],
            axes={"seq": (7, 19)}, make_inputs=_ids_inputs(d), parity_sizes=[{"seq": 1}],
            weights=(f"{text}.embed_tokens",)),
    ]
    for i, name in enumerate(names["prefill"]):
        out.append(ModuleSpec(
            name, build=lambda i=i: wrappers.TextPrefillLayer(model.part(f"{text}.layers.{i}"), text_cfg).eval(),
            inputs=[TensorSpec("h", (1, "seq", H)), TensorSpec("cos", (1, "seq", hd)),
                    TensorSpec("sin", (1, "seq", hd)), TensorSpec("mask", (1, "seq", "seq"))],
            outputs=[TensorSpec("h_out", (1, "seq", H)), TensorSpec("k", (1, kv, "seq", hd)),
                     TensorSpec("v", (1, kv, "seq", hd))],
            axes={"seq": PREFILL_TRACE}, make_inputs=_prefill_inputs(d),
            parity_sizes=[{"seq": 1}, {"seq": 64}], weights=(f"{text}.layers.{i}",)))
    for i, name in enumerate(names["decode"]):
        out.append(ModuleSpec(
            name, build=lambda i=i: wrappers.TextDecodeLayer(model.part(f"{text}.layers.{i}"), text_cfg).eval(),
            inputs=[TensorSpec("h", (1, H)), TensorSpec("cos", (1, 1, hd)), TensorSpec("sin", (1, 1, hd)),
                    TensorSpec("past_k", (1, kv, "past", hd)), TensorSpec("past_v", (1, kv, "past", hd))],
            outputs=[TensorSpec("h_out", (1, H)), TensorSpec("k", (1, kv, 1, hd)), TensorSpec("v", (1, kv, 1, hd))],
            axes={"past": DECODE_TRACE},
            make_inputs=lambda sizes, rng: decode_layer_inputs(d, sizes["past"], rng),
            parity_sizes=[{"past": 1}, {"past": 77}], weights=(f"{text}.layers.{i}",),
            variants=[GPU_DECODE],
            notes="one token over the host's preallocated cache: past read in place, only the new "
                  "K/V rows returned; 2-D hidden -> InnerProduct"))
    out.append(ModuleSpec(
        "lm_head", build=lambda: wrappers.LmHead(model.part(f"{text}.norm"), model.part("lm_head")).eval(),
        inputs=[TensorSpec("h", (1, H))], outputs=[TensorSpec("logits", (1, d["vocab"]))],
        weights=(f"{text}.norm", "lm_head"),
        notes="final RMSNorm + tied head on the last row only (2-D -> InnerProduct)"))
    return out


# The decode layers' attention as Vulkan layers (Concat + SDPA instead of two MatMuls, which ncnn
# runs on the CPU inside a Vulkan net with a host sync each): the graph a GPU-resident decode step
# records, its K/V cache read in place on the device (runtime/cpp: ncnnport-qwen3-asr --vulkan).
GPU_DECODE = GraphVariant("gpu", ("decode_attention_to_sdpa",),
                          why="Vulkan decode: attention as Concat + SDPA, no CPU layer fed from the GPU")


def module_weight_bytes(model) -> dict[str, int]:
    """float32 weight bytes each graph carries, from its declared weights (no tensor is read)."""
    return weight_bytes(module_specs(model), model.source)


def unused_weights(model) -> dict[str, str]:
    """Checkpoint tensors no graph reads, with why: only the layers ``--layers K`` leaves out."""
    d, names = dims(model), model.source.names()
    return {**beyond_layers(names, "model.language_model.layers.{i}", d["layers"]),
            **beyond_layers(names, "model.audio_tower.layers.{i}", d["audio_layers"])}


def static_reshape_decode_spec(model, past: int, patched: bool) -> ModuleSpec:
    """The public ports' decode graph, traced at one cache length, with or without the patch.

    pnnx writes ncnn dims reversed with batch dropped (0=w 1=h 2=c), so repeat_kv's reshape to
    ``[1, heads, past+1, head_dim]`` becomes ``Reshape 0=head_dim 1=past+1 2=heads``.
    """
    d = dims(model)
    patch = ParamPatch("Reshape", where={"0": str(d["head_dim"]), "1": str(past + 1), "2": str(d["heads"])},
                       set={"1": "-1"}, min_matches=2 * d["layers"],
                       why="repeat_kv reshape baked past+1; -1 lets ncnn infer the cache length")
    return ModuleSpec(
        "decode_static", build=lambda: wrappers.StaticReshapeDecode(
            list(model.model.language_model.layers), model.config.text_config).eval(),
        inputs=[TensorSpec("emb", (1, 1, d["hidden"])), TensorSpec("cos", (1, 1, d["head_dim"])),
                TensorSpec("sin", (1, 1, d["head_dim"])), TensorSpec("mask", (1, 1, "past+1")),
                *kv_specs(d, "past", "past_")],
        outputs=[TensorSpec("hidden", (1, 1, d["hidden"])), *kv_specs(d, "past+1", "")],
        axes={"past": (past, None)}, make_inputs=_decode_inputs(d, d["layers"]),
        parity_sizes=[{"past": past + 6}, {"past": 3}], weights=("model.language_model.layers",),
        patches=[patch] if patched else [],
        single_size_reason="reproduces the public ports' single-length decode trace")
