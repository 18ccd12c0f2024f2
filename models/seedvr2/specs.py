"""The SeedVR2 export split: one :class:`ModuleSpec` per ncnn graph.

Graphs (N video tokens, L text tokens, S = window tokens + L; T/H/W pixel frames/size; f/h/w
latent or decoder-internal frames/size):
  vae_encode           x (1,3,T,H,W) -> mean, logvar (1,16,t,h,w)        dynamic T, H, W
  vae_decode_k         decoder segment k (k = 0..3); host depth-to-space in between
  vae_*_image          the single-frame twin of each VAE graph (T = 1 fixed, temporal taps
                       summed: a third of the conv work; runner.image_graph)
  dit_input            (1,N,132), (1,L,txt_in) -> (1,N,D), (1,L,D)
  dit_embedding        sinusoid (1,256) -> emb6 (1,6,D)
  dit_block_XX_pre     norm/modulation/QKV/QK-norm/RoPE of block XX (weights per block)
  dit_attention        one window: q,k,v (1,S,H,hd) -> (1,S,H,hd); weightless, shared by all
  dit_block_XX_post    proj_out/gates/MLP of block XX; attention outputs arrive flattened
                       (1,N,H*hd) (last block: video only)
  dit_output           (1,N,D), emb6 -> (1,N,64)
Host between the graphs (runner.py): patchify, sinusoid, window partition (gather each
window's Q/K/V rows, scatter video outputs, average text outputs), window-local RoPE tables,
VAE depth-to-space (+ frame drop). Every axis is dynamic (traced at two sizes), so one package serves every resolution and
frame count; no per-shape graphs are needed. The two trace sizes must differ in every product
pnnx might fold (H*W above all: with 32x48 and 48x32 pnnx baked H*W = 1536 into the per-frame
GroupNorm reshape and the graph failed at other areas), hence the unequal areas below.

Builds are lazy and local: ``spec_parts`` names the parameters each graph holds, and a spec's
``build()`` asks the model for a view with exactly those (``SeedVR2.view`` returns the built
submodule; ``LazySeedVR2.view`` reads only those tensors), so exporting the real 3B model holds
one graph's weights at a time.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np
from torch import nn

from ncnnport.contract import ModuleSpec, ParamPatch, TensorSpec
from ncnnport.export.weights import beyond_layers, pattern_matches, weight_bytes
from ncnnport.lazy_weights import TensorsSource, WeightSource
from ncnnport.models.seedvr2.lazy import TEXT
from ncnnport.models.seedvr2 import wrappers as W
from ncnnport.models.seedvr2.config import DiTConfig, SeedVR2Config
from ncnnport.models.seedvr2.runner import (block_names, decode_stage_names, decode_stage_temporal,
                                            image_graph, vae_graph_names)

CHANNELS = 1  # the channel axis of a (B, C, T, H, W) video tensor


# VAE trace sizes: (h0, h1), (w0, w1) in pixels for the encoder, latent (f, h, w) pairs for the
# decoder. Every axis differs between the two and so do the products H*W and T*H*W. They are
# kept small because pnnx holds every intermediate of its shape-inference runs: at real width
# the encoder traced at 32x48 / 48x40 px peaked at 1758 MB in pnnx (382 MB of weights), at
# 16x24 / 32x16 at 1106 MB; the last decoder segment went from 1410 to 459 MB.
VAE_TRACE_HW = ((16, 32), (24, 16))
LATENT_TRACE = ((2, 2, 3), (3, 4, 2))


def _tables(n: int, hd: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Valid rotate-half cos / signed-sin tables for random angles (channels j, j+hd/2 pair)."""
    ang = rng.uniform(-40.0, 40.0, size=(1, n, hd // 2)).astype(np.float32)
    c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    return np.concatenate([c, c], axis=-1), np.concatenate([-s, s], axis=-1)


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# --- which weights each graph holds -------------------------------------------------------------
Parts = tuple[str, list[str]]   # (skeleton root, parameter names or prefixes under it)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def block_parts(d: DiTConfig, i: int) -> tuple[list[str], list[str]]:
    """Parameters of block ``i`` read by its pre graph and by its post graph.

    Separate-weight blocks have ``.vid`` / ``.txt`` copies, shared blocks one ``.all``. The last
    block's text goes through QKV and QK-norm unmodulated and has no text output, so its pre
    graph reads only the video attention shift/scale and its post graph only the video stream
    (a separate-weight last block's ``attn.proj_out.txt`` is read by neither)."""
    streams = ("vid",) if d.is_last(i) else ("vid", "txt")
    branch = ["all" if d.shared_weights(i) else s for s in streams]
    pre = ["attn.proj_qkv", "attn.norm_q", "attn.norm_k"]
    pre += [f"ada.{b}.attn_{k}" for b in branch for k in ("shift", "scale")]
    post = [f"attn.proj_out.{b}" for b in branch] + [f"mlp.{b}" for b in branch]
    post += [f"ada.{b}.{k}" for b in branch for k in ("attn_gate", "mlp_shift", "mlp_scale", "mlp_gate")]
    return _unique(pre), _unique(post)


def decode_parts(cfg: SeedVR2Config, k: int) -> list[str]:
    """VAE parameters of decoder segment ``k`` (see ``wrappers.VAEDecodeStage``)."""
    n = len(cfg.vae.block_out_channels)
    head = ["decoder.conv_in", "decoder.mid_block"] if k == 0 else [f"decoder.up_blocks.{k - 1}.upsamplers.0.conv"]
    tail = (["decoder.conv_norm_out", "decoder.conv_out"] if k == n - 1
            else [f"decoder.up_blocks.{k}.upsamplers.0.upscale_conv"])
    return head + [f"decoder.up_blocks.{k}.resnets"] + tail


def spec_parts(cfg: SeedVR2Config) -> dict[str, Parts]:
    """Graph name -> the weights it holds: the one table that drives lazy builds, the weight
    bytes of the memory receipts and the tests of what a build reads."""
    d = cfg.dit
    out: dict[str, Parts] = {"vae_encode": ("vae", ["encoder"])}
    for k, name in enumerate(decode_stage_names(cfg)):
        out[name] = ("vae", decode_parts(cfg, k))
    for name in vae_graph_names(cfg):  # an image twin reads its general graph's weights
        out[image_graph(name)] = out[name]
    out["dit_input"] = ("dit", ["vid_in", "txt_in"])
    out["dit_embedding"] = ("dit", ["emb_in"])
    out["dit_attention"] = ("dit", [])
    for i in range(d.num_layers):
        (pre, post), (pre_parts, post_parts) = block_names(i), block_parts(d, i)
        out[pre], out[post] = (f"dit.blocks.{i}", pre_parts), (f"dit.blocks.{i}", post_parts)
    out["dit_output"] = ("dit", ["vid_out_norm", "vid_out_ada", "vid_out"])
    return out


def graph_weights(parts: Parts) -> tuple[str, ...]:
    """A ``spec_parts`` entry as the spec's declared weights (source names, prefix patterns)."""
    root, names = parts
    return tuple(f"{root}.{n}" for n in names)


def module_weight_bytes(model: Any) -> dict[str, int]:
    """float32 weight bytes each graph holds, from the declared weights (nothing is read)."""
    return weight_bytes(module_specs(model), weight_source(model))


def weight_source(model: Any) -> WeightSource:
    """The lazy model's source, or the tensors of a model built whole under the same names."""
    if hasattr(model, "source"):
        return model.source
    tensors = {f"{root}.{n}": p for root in ("dit", "vae") for n, p in getattr(model, root).named_parameters()}
    return TensorsSource({**tensors, TEXT: model.text})


def unused_weights(model: Any) -> dict[str, str]:
    """Stored tensors no graph reads, each with why (only those the source holds)."""
    d = model.config.dit
    names = weight_source(model).names()
    out = {TEXT: "the prompt embedding is graph input, not a weight: the host feeds it to dit_input "
                 "(shipped in the package's runtime files)"}
    last = d.num_layers - 1
    if not d.shared_weights(last):  # see block_parts; a K-block cut of a checkpoint also stores
        # block K-1's text ada/MLP, which the block does not use in the last-block role
        why = "the last block has no text output and does not modulate text (official)"
        out.update({f"dit.blocks.{last}.{p}": why for p in ("attn.proj_out.txt", "mlp.txt", "ada.txt")
                    if any(pattern_matches(n, f"dit.blocks.{last}.{p}") for n in names)})
    out.update({n: "RoPE frequencies: checked against the config, the host computes the tables"
                for n in names if n.startswith("dit.") and n.endswith(".freqs")})
    return {**out, **beyond_layers(names, "dit.blocks.{i}", d.num_layers)}


def _built(name: str, module: nn.Module) -> nn.Module:
    """A wrapper must hold real weights only: a parameter left on ``meta`` means the graph needs
    a tensor its ``spec_parts`` entry does not list (it would trace to garbage)."""
    meta = [n for n, t in list(module.named_parameters()) + list(module.named_buffers()) if t.is_meta]
    if meta:
        raise RuntimeError(f"{name}: wrapper holds tensors its spec_parts entry does not read: {meta[:6]}")
    return module.eval()


def _builder(model: Any, name: str, parts: Parts, make: Callable[[nn.Module], nn.Module]) -> Callable[[], nn.Module]:
    root, names = parts
    return lambda: _built(name, make(model.view(root, names)))


# --- the split ------------------------------------------------------------------------------------
def dit_specs(model: Any) -> list[ModuleSpec]:
    """DiT graphs. ``model`` is a :class:`.model.SeedVR2` or a :class:`.lazy.LazySeedVR2`; every
    ``build()`` reads only its own graph's weights (``spec_parts``) and returns a fresh wrapper,
    so export holds one graph's weights at a time."""
    cfg: SeedVR2Config = model.config
    d = cfg.dit
    parts = spec_parts(cfg)
    D, H, hd = d.vid_dim, d.heads, d.head_dim
    axes_nl = {"n": (48, 80), "l": (7, 12)}
    specs = [
        ModuleSpec("dit_input", _builder(model, "dit_input", parts["dit_input"], W.DiTInput),
                   [TensorSpec("vid", (1, "n", d.patch_features)), TensorSpec("txt", (1, "l", d.txt_in_dim))],
                   [TensorSpec("vid_h", (1, "n", D)), TensorSpec("txt_h", (1, "l", D))],
                   axes=dict(axes_nl), parity_sizes=[{"n": 1, "l": 1}, {"n": 450, "l": 58}],
                   weights=graph_weights(parts["dit_input"])),
        ModuleSpec("dit_embedding", _builder(model, "dit_embedding", parts["dit_embedding"], W.DiTEmbedding),
                   [TensorSpec("sinus", (1, d.sinusoidal_dim))], [TensorSpec("emb6", (1, 6, D))],
                   notes="timestep sinusoid computed on the host; output rows l*3+g",
                   weights=graph_weights(parts["dit_embedding"])),
        ModuleSpec("dit_attention", lambda: W.DiTAttention(hd).eval(),
                   [TensorSpec(n, (1, "s", H, hd)) for n in ("q", "k", "v")],
                   [TensorSpec("o", (1, "s", H, hd))], axes={"s": (40, 70)},
                   parity_sizes=[{"s": 8}, {"s": 300}],
                   notes="one window's [video, text] sequence; full softmax, scale 1/sqrt(hd)"),
    ]

    def pre_inputs(sizes: Mapping[str, int], rng: np.random.Generator) -> list[np.ndarray]:
        n, l = sizes["n"], sizes["l"]
        cv, sv = _tables(n, hd, rng)
        ct, st = _tables(l, hd, rng)
        return [_normal(rng, 1, n, D), _normal(rng, 1, l, D), _normal(rng, 1, 6, D), cv, sv, ct, st]

    for i in range(d.num_layers):
        pre, post = block_names(i)
        last = d.is_last(i)
        specs.append(ModuleSpec(
            pre, _builder(model, pre, parts[pre], W.DiTBlockPre),
            [TensorSpec("vid", (1, "n", D)), TensorSpec("txt", (1, "l", D)), TensorSpec("emb6", (1, 6, D)),
             TensorSpec("cos_v", (1, "n", hd)), TensorSpec("sin_v", (1, "n", hd)),
             TensorSpec("cos_t", (1, "l", hd)), TensorSpec("sin_t", (1, "l", hd))],
            [TensorSpec(f"{a}_{s}", (1, "n" if s == "v" else "l", H, hd)) for s in ("v", "t") for a in "qkv"],
            axes=dict(axes_nl), make_inputs=pre_inputs, parity_sizes=[{"n": 1, "l": 1}],
            weights=graph_weights(parts[pre]),
            notes="Q/K channels permuted to rotate-half order (attention logits unchanged)"
                  + ("; last block: text normalised, not modulated" if last else "")))
        if last:
            ins = [TensorSpec("vid", (1, "n", D)), TensorSpec("emb6", (1, 6, D)),
                   TensorSpec("attn_v", (1, "n", H * hd))]
            outs = [TensorSpec("vid_out", (1, "n", D))]
            axes = {"n": (48, 80)}
            extra = [{"n": 1}]
        else:
            ins = [TensorSpec("vid", (1, "n", D)), TensorSpec("txt", (1, "l", D)), TensorSpec("emb6", (1, 6, D)),
                   TensorSpec("attn_v", (1, "n", H * hd)), TensorSpec("attn_t", (1, "l", H * hd))]
            outs = [TensorSpec("vid_out", (1, "n", D)), TensorSpec("txt_out", (1, "l", D))]
            axes, extra = dict(axes_nl), [{"n": 1, "l": 1}]
        specs.append(ModuleSpec(post, _builder(model, post, parts[post], W.DiTBlockPost), ins, outs, axes=axes,
                                parity_sizes=extra, weights=graph_weights(parts[post])))
    specs.append(ModuleSpec(
        "dit_output", _builder(model, "dit_output", parts["dit_output"], W.DiTOutput),
        [TensorSpec("vid", (1, "n", D)), TensorSpec("emb6", (1, 6, D))],
        [TensorSpec("vid_out", (1, "n", d.vid_out_channels * 4))], axes={"n": (48, 80)},
        parity_sizes=[{"n": 1}], notes="modulation from the ATTENTION rows of emb (official quirk)",
        weights=graph_weights(parts["dit_output"])))
    return specs


# Per-frame GroupNorm converts to Reduction mean (0=3) over the group's channels and pixels
# (-23303=1,2): the mean and the variance. Under fp16 arithmetic (ncnn's Vulkan default) the
# variance's sum of squares overflows fp16 (65504) from 256x448 frames on (lavapipe: the first
# non-finite blob of vae_encode is the variance Reduction mean_131; the NaN then reaches every
# frame). Feature mask 31=1 (ncnn net.cpp get_masked_option, bit 0: no fp16 arithmetic) keeps
# just these statistics in fp32; the convolutions keep fp16. On the H200 (real-width VAE, Vulkan
# fp16-arithmetic) every output is finite: cosine vs torch 0.99907-0.99989 at 256 and 512.
GROUPNORM_STATS_FP32 = ParamPatch(
    "Reduction", where={"0": "3", "-23303": "1,2"}, set={"31": "1"}, min_matches=2,
    why="GroupNorm statistics overflow fp16 arithmetic (NaN frames on Vulkan fp16): accumulate them in fp32")


def vae_specs(model: Any) -> list[ModuleSpec]:
    cfg: SeedVR2Config = model.config
    parts = spec_parts(cfg)
    v = cfg.vae
    specs = [ModuleSpec(
        "vae_encode", _builder(model, "vae_encode", parts["vae_encode"], W.VAEEncode),
        [TensorSpec("x", (1, v.in_channels, "t", "h", "w"))],
        # (B, C, T, H, W): parity's per-row cosine compares channel vectors (CHANNELS), not W pixels
        [TensorSpec("mean", (1, v.latent_channels, "lt", "lh", "lw"), feature_axis=CHANNELS),
         TensorSpec("logvar", (1, v.latent_channels, "lt", "lh", "lw"), feature_axis=CHANNELS)],
        axes={"t": (5, 9), "h": VAE_TRACE_HW[0], "w": VAE_TRACE_HW[1]},
        make_inputs=lambda sizes, rng: [rng.uniform(-1, 1, (1, v.in_channels, sizes["t"], sizes["h"], sizes["w"]))
                                        .astype(np.float32)],
        parity_sizes=[{"t": 1, "h": 16, "w": 16}, {"t": 1, "h": 64, "w": 40}],
        release_after_call=True,  # activations: GBs at 512x512, weights 382 MB
        weights=graph_weights(parts["vae_encode"]),
        patches=[GROUPNORM_STATS_FP32],
        notes="causal 3-D conv folded into one 2-D Convolution (taps -> channels, frames -> rows; "
              "conv_fold.py); per-frame GroupNorm via "
              "reshape + mean/var; T must be 4n+1, H and W multiples of 8")]
    # Decoder segments: the sizes entering segment k follow from the latent (f, h, w).
    temporal = decode_stage_temporal(cfg)
    chans = list(reversed(v.block_out_channels))

    def sizes_at(k: int, f: int, h: int, w: int) -> tuple[int, int, int]:
        for j in range(k):
            f = 2 * f - 1 if temporal[j] else f
            h, w = 2 * h, 2 * w
        return f, h, w

    for k, name in enumerate(decode_stage_names(cfg)):
        cin = v.latent_channels if k == 0 else chans[k - 1]
        last = k == len(chans) - 1
        cout = v.in_channels if last else chans[k] * (8 if temporal[k] else 4)
        a0, a1 = sizes_at(k, *LATENT_TRACE[0]), sizes_at(k, *LATENT_TRACE[1])
        extra = [dict(zip("fhw", sizes_at(k, 1, 2, 2))), dict(zip("fhw", sizes_at(k, 1, 5, 3)))]
        specs.append(ModuleSpec(
            name, _builder(model, name, parts[name], lambda vae, k=k: W.VAEDecodeStage(vae, k)),
            [TensorSpec("x", (1, cin, "f", "h", "w"))], [TensorSpec("y", (1, cout, "f", "h", "w"), feature_axis=CHANNELS)],
            axes={"f": (a0[0], a1[0]), "h": (a0[1], a1[1]), "w": (a0[2], a1[2])},
            parity_sizes=extra, release_after_call=True, patches=[GROUPNORM_STATS_FP32],
            weights=graph_weights(parts[name]),
            notes="decoder segment; the host applies depth-to-space"
                  + ("" if last else (" with frame drop" if temporal[k] else " (spatial)")) + " after it"))
    enc, decs = specs[0], specs[1:]
    twins = [image_twin(enc, "t", _builder(model, image_graph(enc.name), parts[enc.name],
                                           lambda vae: W.VAEEncode(vae, single_frame=True)),
                        make_inputs=lambda sizes, rng: [rng.uniform(-1, 1, (1, v.in_channels, 1, sizes["h"], sizes["w"]))
                                                        .astype(np.float32)])]
    twins += [image_twin(s, "f", _builder(model, image_graph(s.name), parts[s.name],
                                          lambda vae, k=k: W.VAEDecodeStage(vae, k, single_frame=True)))
              for k, s in enumerate(decs)]
    return specs + twins


def image_twin(spec: ModuleSpec, frame_axis: str, build: Callable[[], nn.Module],
               make_inputs: Any = None) -> ModuleSpec:
    """``spec``'s single-frame twin (``runner.image_graph``): the frame axis (dim 2 of every
    input and output) fixed at 1, ``build`` tracing the wrapper with its temporal taps summed;
    weights, patches, tolerances and memory hints as the general graph's."""
    def one_frame(t: TensorSpec) -> TensorSpec:
        return dataclasses.replace(t, shape=tuple(1 if i == 2 else d for i, d in enumerate(t.shape)))

    return dataclasses.replace(
        spec, name=image_graph(spec.name), build=build, make_inputs=make_inputs,
        inputs=[one_frame(t) for t in spec.inputs], outputs=[one_frame(t) for t in spec.outputs],
        axes={a: n for a, n in spec.axes.items() if a != frame_axis},
        parity_sizes=[{a: n for a, n in sz.items() if a != frame_axis} for sz in spec.parity_sizes],
        notes=f"{spec.name} for one frame (an image): temporal taps summed, a third of its 3x3x3 "
              f"convs' work; {spec.notes}")


def module_specs(model: Any) -> list[ModuleSpec]:
    return vae_specs(model) + dit_specs(model)
