"""The export split of Youtu-VL as ModuleSpecs (the contract every generic stage reads).

Split decisions (see wrappers.py for the graph bodies):
- vision, default ``vision_mode="segments"``: ``vision_seg{k}``, one graph per maximal run of
  window blocks or full-attention blocks (real: 0-6 | 7 | 8-14 | 15 | 16-22 | 23 | 24-25 | 26).
  Window runs are executed once per window (<= 256 patches), full runs once over all patches; no
  mask input, so memory and attention cost do not grow with N^2 in window blocks. The first
  segment embeds patches, the last applies post-LN; window permutation and RoPE tables are host
  work.
- vision, ``vision_mode="masked"``: ``vision_tower``, one graph for all blocks with a
  ``[1,N,N]`` block-diagonal window mask input (simple, but O(N^2) mask memory and every window
  block attends over all N keys).
- ``merger``: RMSNorm + 2x2 concat + MLP on the raster-order tower output.
- ``text_embed``: ncnn Embed over int32 ids, only for an untied checkpoint. With
  ``tie_word_embeddings`` (Youtu-LLM) the host reads the rows out of ``lm_head.ncnn.bin``
  (``tied_embed.py``), so the ``[V,H]`` table is stored once (tiny: -41 MB, 49% of the package).
- ``llm_layer{i}``: one graph per decoder layer serving prefill and decode (dynamic query and
  past lengths): reads the host's preallocated latent cache in place, returns the new rows only.
- ``lm_head``: final norm + tied head on the last row (static ``[1,1,H]``).
- ``decode`` variants of the layers and the head (``llm_layer{i}.decode.ncnn.param`` over the same
  ``.bin``): Gemm -> InnerProduct, so one-token steps can read fp16 weights.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ncnnport.contract import GraphVariant, ModuleSpec, TensorSpec
from ncnnport.export.weights import beyond_layers, weight_bytes
from ncnnport.lazy_weights import TensorsSource, WeightSource
from ncnnport.models.youtu_vl.checkpoint import IGNORED_KEYS, TIED_KEY
from ncnnport.models.youtu_vl import wrappers
from ncnnport.models.youtu_vl.model import YoutuVL
from ncnnport.models.youtu_vl.pipeline import DECODE, WINDOW_CONCURRENT_CALLS  # the variant name lives with the torch-free pipeline
from ncnnport.models.youtu_vl.pipeline import (EMBED, MERGER, VISION, HeadShard, VisionSegment,
                                               head_shards, layer_masks, layer_name, vision_segments)
from ncnnport.models.youtu_vl.processor import patch_permutation, patch_positions, window_layout
from ncnnport.runtime import masks
from ncnnport.runtime.rope import span
from ncnnport.runtime.rope2d import axial_cos_sin, axial_inv_freq
from ncnnport.models.youtu_vl.wrappers import TOWER

# patch counts -> a grid with that many patches exercising a window case
_GRIDS = {64: (8, 8), 216: (12, 18), 680: (34, 20), 256: (2, 128), 4: (2, 2)}


def grid_for(n: int) -> tuple[int, int]:
    if n in _GRIDS:
        return _GRIDS[n]
    if n % 4:
        raise ValueError(f"patch count {n} is not a multiple of 4")
    return 2, n // 2


# The vision tower and merger are compute-bound (hundreds of patch rows through 1152-wide
# projections): under int8-weights their Gemms run ncnn's int8 dot products too (on a 2-core Intel
# Xeon with VNNI a real-width layer at 448 took 94.5 against 217 ms in fp32, torch 179), judged by
# the int8 budgets like the decode projections.
VISION_INT8_ROWS = True


def _vision_spec(vl: YoutuVL) -> ModuleSpec:
    v = vl.cfg.vision

    def make(sizes: Mapping[str, int], rng: np.random.Generator):
        gh, gw = grid_for(sizes["patches"])
        index, cu = window_layout(gh, gw, v.spatial_merge_size, v.window_tokens)
        perm = patch_permutation(index, v.merge_unit)
        cos, sin = axial_cos_sin(patch_positions(gh, gw, v.spatial_merge_size)[perm],
                                 axial_inv_freq(v.head_dim, v.rope_theta))
        pv = rng.uniform(-1, 1, (1, gh * gw, v.patch_dim)).astype(np.float32)
        return [pv, cos[None], sin[None], masks.block_diagonal(cu)]

    return ModuleSpec(
        name=VISION, build=lambda: wrappers.VisionTowerGraph(vl).eval(),
        inputs=[TensorSpec("pixel_values", (1, "patches", v.patch_dim)),
                TensorSpec("cos", (1, "patches", v.head_dim)),
                TensorSpec("sin", (1, "patches", v.head_dim)),
                TensorSpec("window_mask", (1, "patches", "patches"))],
        outputs=[TensorSpec("vision_hidden", (1, "patches", v.hidden_size))],
        axes={"patches": (216, 64)}, make_inputs=make,
        parity_sizes=[{"patches": 680}, {"patches": 256}, {"patches": 4}],
        weights=(f"{TOWER}.embeddings.patch_embedding", f"{TOWER}.encoder.layers", f"{TOWER}.post_layernorm"),
        int8_rows=VISION_INT8_ROWS, notes="patches in window order; host applies argsort(window permutation) afterwards")


def _segment_spec(vl: YoutuVL, seg: VisionSegment) -> ModuleSpec:
    v = vl.cfg.vision
    width = v.patch_dim if seg.first else v.hidden_size

    def make(sizes: Mapping[str, int], rng: np.random.Generator):
        n = sizes["patches"]
        gh, gw = grid_for(n)
        cos, sin = axial_cos_sin(patch_positions(gh, gw, v.spatial_merge_size),
                                 axial_inv_freq(v.head_dim, v.rope_theta))
        x = (rng.uniform(-1, 1, (1, n, width)) if seg.first else rng.standard_normal((1, n, width)))
        return [x.astype(np.float32), cos[None], sin[None]]

    kind = "window" if seg.windowed else "full-attention"
    # a window holds at most window_tokens^2 merged tokens; full segments see the whole image
    most = v.window_tokens ** 2 * v.merge_unit
    axes = {"patches": (192, 24)} if seg.windowed else {"patches": (216, 64)}
    extra = [{"patches": most}, {"patches": 4}] if seg.windowed else [{"patches": 680}, {"patches": 4}]
    return ModuleSpec(
        name=seg.name,
        build=lambda: wrappers.VisionSegmentGraph(vl, seg.start, seg.end, first=seg.first,
                                                  last=seg.last).eval(),
        inputs=[TensorSpec("pixel_values" if seg.first else "hidden", (1, "patches", width)),
                TensorSpec("cos", (1, "patches", v.head_dim)),
                TensorSpec("sin", (1, "patches", v.head_dim))],
        outputs=[TensorSpec("vision_hidden" if seg.last else "hidden_out", (1, "patches", v.hidden_size))],
        axes=axes, make_inputs=make, parity_sizes=extra, int8_rows=VISION_INT8_ROWS,
        concurrent_calls=WINDOW_CONCURRENT_CALLS if seg.windowed else 1,
        weights=tuple(([f"{TOWER}.embeddings.patch_embedding"] if seg.first else [])
                      + [f"{TOWER}.encoder.layers.{i}" for i in range(seg.start, seg.end)]
                      + ([f"{TOWER}.post_layernorm"] if seg.last else [])),
        notes=f"vision blocks {seg.start}..{seg.end - 1} ({kind}"
              f"{', run once per window' if seg.windowed else ''})"
              f"{'; starts with the patch embedding' if seg.first else ''}"
              f"{'; ends with post-LN' if seg.last else ''}")


def _merger_spec(vl: YoutuVL) -> ModuleSpec:
    v = vl.cfg.vision
    return ModuleSpec(
        name=MERGER, build=lambda: wrappers.MergerGraph(vl).eval(),
        inputs=[TensorSpec("vision_hidden", (1, "patches", v.hidden_size))],
        outputs=[TensorSpec("visual_tokens", (1, "tokens", v.out_hidden_size))],
        axes={"patches": (216, 64)}, parity_sizes=[{"patches": 680}, {"patches": 4}], weights=("merger",),
        make_inputs=lambda s, rng: [rng.standard_normal((1, s["patches"], v.hidden_size)).astype(np.float32)],
        int8_rows=VISION_INT8_ROWS, notes="4 consecutive rows = one 2x2 merge block")


def _embed_spec(vl: YoutuVL) -> ModuleSpec:
    t = vl.cfg.text
    return ModuleSpec(
        name=EMBED, build=lambda: wrappers.TextEmbedGraph(vl).eval(),
        inputs=[TensorSpec("ids", (1, "seq"), "int32")],
        outputs=[TensorSpec("embeds", (1, "seq", t.hidden_size))],
        axes={"seq": (17, 5)}, parity_sizes=[{"seq": 1}, {"seq": 300}], weights=("model.embed_tokens",),
        make_inputs=lambda s, rng: [rng.integers(0, t.vocab_size, (1, s["seq"])).astype(np.int32)],
        notes="int32 ids (int64 silently selects wrong rows in ncnn)")


# One-token decode graphs over the same weights: pnnx's Gemm (fast on prefill's many rows, fp32
# weights only on x86) becomes InnerProduct, which reads fp16 weights under use_fp16_storage
# (measured at real widths: one layer 35.6 ms vs Gemm fp32 48.1 ms, but 3.6x slower on prefill).
def _decode_variant(sizes: tuple[Mapping[str, int], ...] = ()) -> GraphVariant:
    return GraphVariant(DECODE, ("gemm_to_innerproduct",), sizes,
                        why="one-token decode: InnerProduct reads fp16 weights under use_fp16_storage")


def _layer_spec(vl: YoutuVL, i: int) -> ModuleSpec:
    t = vl.cfg.text

    def make(sizes: Mapping[str, int], rng: np.random.Generator):
        s, p = sizes["seq"], sizes["past"]
        cos, sin = span(p - 1, s, t.qk_rope_head_dim, t.rope_theta)
        past_mask, mask = layer_masks(s, p)
        return [rng.standard_normal((1, s, t.hidden_size)).astype(np.float32), cos, sin, past_mask, mask,
                rng.standard_normal((1, 1, p, t.kv_lora_rank)).astype(np.float32),
                rng.standard_normal((1, 1, p, t.qk_rope_head_dim)).astype(np.float32)]

    return ModuleSpec(
        name=layer_name(i), build=lambda: wrappers.DecoderLayerGraph(vl, i).eval(),
        inputs=[TensorSpec("hidden", (1, "seq", t.hidden_size)),
                TensorSpec("cos", (1, "seq", t.qk_rope_head_dim)),
                TensorSpec("sin", (1, "seq", t.qk_rope_head_dim)),
                TensorSpec("past_mask", (1, "seq", "past")),
                TensorSpec("mask", (1, "seq", "seq")),
                TensorSpec("past_latent", (1, 1, "past", t.kv_lora_rank)),
                TensorSpec("past_krot", (1, 1, "past", t.qk_rope_head_dim))],
        outputs=[TensorSpec("hidden_out", (1, "seq", t.hidden_size)),
                 TensorSpec("latent", (1, 1, "seq", t.kv_lora_rank)),
                 TensorSpec("krot", (1, 1, "seq", t.qk_rope_head_dim))],
        axes={"seq": (7, 3), "past": (4, 9)}, make_inputs=make,
        parity_sizes=[{"seq": 1, "past": 1}, {"seq": 1, "past": 40}, {"seq": 1, "past": 1001},
                      {"seq": 120, "past": 1}],
        variants=[_decode_variant(({"seq": 1, "past": 1}, {"seq": 1, "past": 40}, {"seq": 1, "past": 1001}))],
        weights=(f"model.layers.{i}",),
        notes="absorbed MLA over the host's latent cache (read in place, new rows returned); "
              "cache row 0 is a zero dummy that past_mask hides (prefill uses past=1)")


def _head_spec(vl: YoutuVL, shard: HeadShard) -> ModuleSpec:
    t = vl.cfg.text
    rows = shard.stop - shard.start
    whole = rows == t.vocab_size
    return ModuleSpec(
        name=shard.name, build=lambda: wrappers.LmHeadGraph(vl, (shard.start, shard.stop)).eval(),
        inputs=[TensorSpec("hidden", (1, 1, t.hidden_size))],
        outputs=[TensorSpec("logits", (1, 1, rows))],
        make_inputs=lambda s, rng: [rng.standard_normal((1, 1, t.hidden_size)).astype(np.float32)],
        variants=[_decode_variant()],
        weights=("model.norm", TIED_KEY if whole else f"{TIED_KEY}@{shard.start}:{shard.stop}"),
        notes="final RMSNorm + tied lm_head, last row only" if whole else
              f"final RMSNorm + tied lm_head rows {shard.start}..{shard.stop - 1} (vocab shard)")


def module_specs(vl: YoutuVL, vision_mode: str = "segments") -> list[ModuleSpec]:
    """The split. ``vision_mode``: "segments" (default: no mask, windows run separately) or
    "masked" (one tower graph with an ``[1,N,N]`` window-mask input)."""
    if vision_mode == "segments":
        vision = [_segment_spec(vl, seg) for seg in vision_segments(vl.cfg)]
    elif vision_mode == "masked":
        vision = [_vision_spec(vl)]
    else:
        raise ValueError(f"vision split mode {vision_mode!r}: use 'segments' or 'masked'")
    embed = [] if vl.cfg.text.tie_word_embeddings else [_embed_spec(vl)]  # tied: host row lookup
    return [*vision, _merger_spec(vl), *embed,
            *(_layer_spec(vl, i) for i in range(vl.cfg.text.num_hidden_layers)),
            *(_head_spec(vl, shard) for shard in head_shards(vl.cfg))]



def module_weight_bytes(vl) -> dict[str, int]:
    """float32 weight bytes per graph, from the declared weights (a head shard counts its rows)."""
    return weight_bytes(module_specs(vl), weight_source(vl))


def weight_source(vl) -> WeightSource:
    """The lazy model's source, or the tensors of a model built whole (tests build one)."""
    if hasattr(vl, "source"):
        return vl.source
    tied = {TIED_KEY: "model.embed_tokens.weight"} if vl.cfg.text.tie_word_embeddings else {}
    return TensorsSource(dict(vl.named_parameters()), aliases=tied)


def unused_weights(vl) -> dict[str, str]:
    """Checkpoint tensors no graph reads, with why: the ignored keys the folder holds and the LLM
    layers ``--layers K`` leaves out."""
    names = weight_source(vl).names()
    out = {k: why for k, why in IGNORED_KEYS.items() if k in names}
    return {**out, **beyond_layers(names, "model.layers.{i}", vl.cfg.text.num_hidden_layers)}
