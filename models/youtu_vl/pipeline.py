"""The Youtu-VL inference pipeline, written once against module runners.

``runners[name].run(list[np.ndarray]) -> list[np.ndarray]`` is either an ncnn graph
(``NcnnModule``) or the torch export wrapper (``TorchModule``), so the same code is the ncnn
runtime, the e2e parity candidate and a check of the split itself. Host work: image processing,
window permutation and its inverse, RoPE tables and masks (from ``ncnnport.runtime``), token
fusion, the tied token-embedding row lookup (``tied_embed``), the latent KV cache bookkeeping
and greedy selection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ncnnport.models.youtu_vl.config import EOS_ID, YoutuVLConfig, check_positions
from ncnnport.models.youtu_vl.processor import (ProcessedImage, patch_permutation, patch_positions,
                                                window_layout)
from ncnnport.models.youtu_vl.prompt import fuse
from ncnnport.models.youtu_vl.tied_embed import with_tied_embedding
from ncnnport.runtime import masks
from ncnnport.runtime.concurrent_calls import run_each
from ncnnport.runtime.preallocated_cache import PreallocatedKVCache
from ncnnport.runtime.rope import span
from ncnnport.runtime.rope2d import axial_cos_sin, axial_inv_freq
from ncnnport.runtime.sampling import greedy
from ncnnport.runtime.variants import with_variant
from ncnnport.runtime.zero_copy import zero_copy

VISION, MERGER, EMBED, LM_HEAD = "vision_tower", "merger", "text_embed", "lm_head"
DECODE = "decode"  # the graph variant of the one-token steps (specs.decode_variant); here so the
                   # torch-free run path (``run --package``) can name it without the wrappers
# A head table above this many float32 bytes is split into vocab-row shards ``lm_head_part{k}``.
# Why: pnnx holds ~4x a module's weights (measured: 11.1 GB for the real 2.77 GB tied table),
# so one 283386 x 2560 graph dominates the peak memory of the whole conversion; shards of <= 512
# MiB keep pnnx near 2 GB and every host-side step (logits, tied rows) just concatenates.
HEAD_SHARD_BYTES = 512 << 20
HEAD_ROW_ALIGN = 16  # rows per head shard are a multiple of this (see head_shards)


def layer_name(i: int) -> str:
    return f"llm_layer{i}"


@dataclass(frozen=True)
class HeadShard:
    name: str
    start: int  # first vocab row
    stop: int


def head_shards(cfg: YoutuVLConfig, max_bytes: int | None = None) -> list[HeadShard]:
    """The head graphs: one ``lm_head`` when the table is small, else vocab-row shards whose row
    counts are multiples of :data:`HEAD_ROW_ALIGN`, plus one last shard of the ``V % 16``
    leftover rows when there are any (real: 5 x 47232 + 47216 + 10 rows).

    Why aligned: ncnn's x86 InnerProduct (the ``decode`` variant, the only fp16-weight path) packs
    its outputs by 16/8/4 only when ``num_output`` divides; otherwise every output row is a
    single dependent FMA chain (measured on one 2560-wide shard, 1 thread, fp16 weights, interleaved:
    47231 rows 1.35x the time of 47232). Equal shards of Youtu-VL's 283386 rows had 47231 rows each."""
    max_bytes = HEAD_SHARD_BYTES if max_bytes is None else max_bytes
    t = cfg.text
    n = -(-4 * t.vocab_size * t.hidden_size // max_bytes)
    if n <= 1:
        return [HeadShard(LM_HEAD, 0, t.vocab_size)]
    aligned = t.vocab_size - t.vocab_size % HEAD_ROW_ALIGN
    rows = -(-aligned // (n * HEAD_ROW_ALIGN)) * HEAD_ROW_ALIGN
    while rows > HEAD_ROW_ALIGN and 4 * rows * t.hidden_size > max_bytes:  # rounding up overshot
        n += 1
        rows = -(-aligned // (n * HEAD_ROW_ALIGN)) * HEAD_ROW_ALIGN
    bounds = [*range(0, aligned, rows), aligned]
    if aligned < t.vocab_size:
        bounds.append(t.vocab_size)
    return [HeadShard(f"{LM_HEAD}_part{k}", a, b) for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def head_logits(runners: Mapping[str, Any], hidden: np.ndarray, cfg: YoutuVLConfig) -> np.ndarray:
    """``[1,1,H]`` -> ``[1,1,V]``: every head shard in vocab order, concatenated."""
    hidden = np.ascontiguousarray(hidden, dtype=np.float32)
    parts = [runners[shard.name].run([hidden])[0] for shard in head_shards(cfg)]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1)


# a window segment's calls (one per window) are independent: up to 4 run at once, the windows of
# a 448x448 image (2 x 2), so the default image fills the threads too. One window call leaves
# most of 16 threads idle (device Xeon, int8 window layer at 448, 16 threads: 19 ms side by side,
# 31 ms one window at a time); more than 4 at once would give a 448 image fewer threads per
# window than it has threads. The split is fixed at load; a window that would run alone on it
# (an image of one window, 224x224) runs on the same graph loaded for all the threads instead
# (NcnnModule.run_each: 10 ms on the split's 4 threads against 6 on all 16; runtime/cpp/README.md)
WINDOW_CONCURRENT_CALLS = 4


@dataclass(frozen=True)
class VisionSegment:
    """Blocks ``start..end-1`` of one attention kind (see ``wrappers.VisionSegmentGraph``)."""

    index: int
    start: int
    end: int
    windowed: bool
    first: bool
    last: bool

    @property
    def name(self) -> str:
        return f"vision_seg{self.index}"


def vision_segments(cfg: YoutuVLConfig) -> list[VisionSegment]:
    """Maximal runs of consecutive window blocks / full-attention blocks."""
    v = cfg.vision
    kinds = [i not in v.fullatt_block_indexes for i in range(v.num_hidden_layers)]
    runs: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(kinds) + 1):
        if i == len(kinds) or kinds[i] != kinds[start]:
            runs.append((start, i))
            start = i
    return [VisionSegment(k, a, b, kinds[a], k == 0, k == len(runs) - 1) for k, (a, b) in enumerate(runs)]


def vision_module_names(cfg: YoutuVLConfig, mode: str = "segments") -> list[str]:
    if mode == "segments":
        return [s.name for s in vision_segments(cfg)]
    if mode == "masked":
        return [VISION]
    raise ValueError(f"vision split mode {mode!r}: use 'segments' or 'masked'")


def module_names(cfg: YoutuVLConfig, vision_mode: str = "segments") -> list[str]:
    """Exported graphs. A tied token embedding has no graph: the host reads its rows from the
    lm_head weights (``tied_embed``), so the package stores the ``[V,H]`` table once."""
    embed = [] if cfg.text.tie_word_embeddings else [EMBED]
    return [*vision_module_names(cfg, vision_mode), MERGER, *embed,
            *(layer_name(i) for i in range(cfg.text.num_hidden_layers)), *(h.name for h in head_shards(cfg))]


# --- vision -------------------------------------------------------------------------------------
@dataclass
class VisionInputs:
    """Graph inputs in window order plus the permutation that produced them."""

    pixel_values: np.ndarray  # [1,N,P]
    cos: np.ndarray           # [1,N,hd]
    sin: np.ndarray
    cu_seqlens: np.ndarray    # window boundaries over the permuted patches
    perm: np.ndarray          # window position -> raster row (patch granularity)

    def window_mask(self) -> np.ndarray:
        """``[1,N,N]`` block-diagonal mask for the single-graph ("masked") split: O(N^2) memory."""
        return masks.block_diagonal(self.cu_seqlens)

    def windows(self) -> list[tuple[int, int]]:
        cu = [int(c) for c in self.cu_seqlens]
        return list(zip(cu[:-1], cu[1:]))


def vision_inputs(image: ProcessedImage, cfg: YoutuVLConfig) -> VisionInputs:
    v = cfg.vision
    gh, gw = image.grid_hw
    index, cu = window_layout(gh, gw, v.spatial_merge_size, v.window_tokens)
    perm = patch_permutation(index, v.merge_unit)
    cos, sin = axial_cos_sin(patch_positions(gh, gw, v.spatial_merge_size)[perm],
                             axial_inv_freq(v.head_dim, v.rope_theta))
    pv = np.ascontiguousarray(image.pixel_values[perm], dtype=np.float32)
    return VisionInputs(pv[None], cos[None], sin[None], cu, perm)


def encode_image(runners: Mapping[str, Any], image: ProcessedImage,
                 cfg: YoutuVLConfig) -> tuple[np.ndarray, np.ndarray]:
    """(tower output ``[N,D]`` in raster order, merged visual tokens ``[N/4,out]``)."""
    vin = vision_inputs(image, cfg)
    if VISION in runners:  # single graph, window mask as input
        (windowed,) = runners[VISION].run([vin.pixel_values, vin.cos, vin.sin, vin.window_mask()])
    else:
        windowed = run_vision_segments(runners, vin, cfg)
    raster = np.empty_like(windowed[0])
    raster[vin.perm] = windowed[0]          # inverse permutation: argsort(perm) applied as a scatter
    (merged,) = runners[MERGER].run([raster[None]])
    return raster, merged[0]


def run_vision_segments(runners: Mapping[str, Any], vin: VisionInputs, cfg: YoutuVLConfig) -> np.ndarray:
    """Window segments once per window (the windows side by side, ``concurrent_calls``),
    full-attention segments once over all patches."""
    h, cos, sin = vin.pixel_values, vin.cos, vin.sin
    for seg in vision_segments(cfg):
        runner = runners[seg.name]
        if seg.windowed:
            calls = [[np.ascontiguousarray(t[:, a:b]) for t in (h, cos, sin)] for a, b in vin.windows()]
            h = np.concatenate([out[0] for out in run_each(runner, calls)], axis=1)
        else:
            (h,) = runner.run([h, cos, sin])
    return h


# --- LLM ----------------------------------------------------------------------------------------
def layer_masks(seq: int, past: int) -> tuple[np.ndarray, np.ndarray]:
    """The two additive masks of ``llm_layer{i}``: ``past_mask [1,seq,past]`` (every cached row
    visible except row 0, the dummy) and ``mask [1,seq,seq]`` (causal over the new rows)."""
    full = masks.causal(seq, past, hidden=(0,))
    return np.ascontiguousarray(full[..., :past]), np.ascontiguousarray(full[..., past:])


class LatentCache:
    """Per-layer latent cache, allocated once per generation and written in place.

    Row 0 is a zero dummy that ``past_mask`` hides (a prefill then still has a one-row past;
    see DecoderLayerGraph). Each layer reads ``past(i)`` (views ``[1,1,P,kv_lora]`` and ``[1,1,P,rope]``
    of ncnn-owned buffers, handed to ncnn without a copy) and the host writes the rows it returns,
    so a step copies nothing of the past (``runtime.preallocated_cache``).
    """

    def __init__(self, cfg: YoutuVLConfig, capacity: int) -> None:
        t = cfg.text
        if capacity < 1:
            raise ValueError(f"youtu-vl latent cache: capacity {capacity} must hold at least one position")
        self.store = PreallocatedKVCache(t.num_hidden_layers, 1, t.kv_lora_rank, capacity + 1,
                                         owner="youtu-vl latent cache", value_dim=t.qk_rope_head_dim)
        dummy = (np.zeros((1, 1, 1, t.kv_lora_rank), np.float32), np.zeros((1, 1, 1, t.qk_rope_head_dim), np.float32))
        for i in range(t.num_hidden_layers):
            self.store.write(i, *dummy)
        self.store.commit(1)

    @classmethod
    def empty(cls, cfg: YoutuVLConfig, capacity: int) -> "LatentCache":
        """A cache for ``capacity`` real positions (prompt + generated tokens)."""
        return cls(cfg, capacity)

    @property
    def seen(self) -> int:
        """Real tokens cached (positions 0..seen-1); the dummy row is not one."""
        return self.store.length - 1

    @property
    def capacity(self) -> int:
        return self.store.capacity - 1

    def past(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Views of layer ``layer``'s dummy + cached rows: ``[1,1,1+seen,kv_lora]``, ``[1,1,1+seen,rope]``."""
        return self.store.past(layer)


def forward_llm(runners: Mapping[str, Any], embeds: np.ndarray, cache: LatentCache,
                cfg: YoutuVLConfig, *, commit: bool = True) -> np.ndarray:
    """Run ``embeds [S,H]`` through all layers, write their latent rows into ``cache``, return
    last-row logits ``[V]``. ``commit=False`` forgets the rows afterwards (a benchmark repeats one
    position)."""
    h = forward_layers(runners, embeds[None], cache, cfg, commit=commit)
    return head_logits(runners, h[:, -1:], cfg).reshape(-1)


def forward_layers(runners: Mapping[str, Any], hidden: np.ndarray, cache: LatentCache, cfg: YoutuVLConfig, *,
                   commit: bool = True) -> np.ndarray:
    """``hidden [1,S,H]`` through every ``llm_layer{i}`` at position ``cache.seen``; returns the last
    layer's ``[1,S,H]``. Each layer reads the past in place and its new rows are written after it ran."""
    t = cfg.text
    s = hidden.shape[1]
    cos, sin = span(cache.seen, s, t.qk_rope_head_dim, t.rope_theta)
    past_mask, mask = layer_masks(s, cache.seen + 1)  # row 0 of the cache is the dummy
    h = np.ascontiguousarray(hidden, dtype=np.float32)
    for i in range(t.num_hidden_layers):
        latent, krot = cache.past(i)
        h, new_latent, new_krot = zero_copy(runners[layer_name(i)]).run([h, cos, sin, past_mask, mask, latent, krot])
        cache.store.write(i, new_latent, new_krot)
    if commit:
        cache.store.commit(s)
    else:
        cache.store.discard()
    return h


def embed_ids(runners: Mapping[str, Any], ids: np.ndarray) -> np.ndarray:
    """Token embeddings ``[S,H]`` from ``runners[EMBED]`` (a graph, or the host lookup that
    ``tied_embed.with_tied_embedding`` adds for a tied checkpoint)."""
    (emb,) = runners[EMBED].run([np.asarray(ids, dtype=np.int32).reshape(1, -1)])
    return emb[0]


@dataclass
class Generation:
    vision: np.ndarray | None
    merged: np.ndarray | None
    first_logits: np.ndarray
    tokens: list[int] = field(default_factory=list)
    step_logits: list[np.ndarray] = field(default_factory=list)


def decode_runners(modules: Mapping[str, Any]) -> dict[str, Any] | None:
    """The graphs of the one-token steps: the layers' and head's ``decode`` variants (InnerProduct)
    when the graphs store fp16 (``--precision fp16-*``), because only InnerProduct reads fp16
    weights on x86 (about half the bytes per token); None under fp32/bf16 storage, where the
    prompt graphs serve the steps too. The variants keep the graphs' own options."""
    options = getattr(next(iter(modules.values())), "options", None)  # torch runners have none
    if options is None or not options.fp16_storage:
        return None
    return {n: m for n, m in with_variant(modules, DECODE).items() if m is not modules[n]}


def generate(runners: Mapping[str, Any], cfg: YoutuVLConfig, ids: np.ndarray,
             image: ProcessedImage | None, max_new_tokens: int, *, stop_at_eos: bool = True,
             on_token: Callable[[int], None] | None = None, keep_logits: bool = False,
             forced: Sequence[int] | None = None,
             decode_runners: Mapping[str, Any] | None = None) -> Generation:
    """Greedy generation; ``on_token`` is called with every new id (streaming).

    ``decode_runners`` (optional) run the one-token steps after the prefill, e.g. the layers'
    and head's ``decode`` variants with fp16 weights (``runtime.variants.with_variant``); the
    prompt still goes through ``runners``, whose Gemm graphs are the fast ones on many rows.

    ``forced`` (teacher forcing): step i feeds ``forced[i]`` instead of the argmax, so the
    pipeline sees exactly the reference's sequence and its step logits can be compared with the
    reference's one by one (KL, top-k); ``gen.tokens`` still records this pipeline's own argmax.
    At most ``len(forced)`` steps run.
    """
    if forced is not None:
        max_new_tokens = min(max_new_tokens, len(forced))
    check_positions(int(ids.size), max_new_tokens, cfg)
    runners = with_tied_embedding(runners)
    stepper = runners if decode_runners is None else {**runners, **decode_runners}
    vision = merged = None
    if image is not None:
        vision, merged = encode_image(runners, image, cfg)
    embeds = fuse(embed_ids(runners, ids), ids, merged)
    cache = LatentCache.empty(cfg, int(embeds.shape[0]) + max(max_new_tokens, 1))
    logits = forward_llm(runners, embeds, cache, cfg)
    gen = Generation(vision, merged, logits)
    for step in range(max_new_tokens):
        token = greedy(logits)
        gen.tokens.append(token)
        if keep_logits:
            gen.step_logits.append(logits)
        if on_token is not None:
            on_token(token)
        if (stop_at_eos and token == EOS_ID) or step == max_new_tokens - 1:
            break
        fed = token if forced is None else int(forced[step])
        logits = forward_llm(stepper, embed_ids(runners, np.array([fed])), cache, cfg)
    return gen
