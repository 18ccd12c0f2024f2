"""Bench stages for SeedVR2: one DiT block, the VAE encoder and decoder, the whole DiT.

Sizes are pixel ``HxW`` of one image (T = 1). Each factory returns a zero-argument callable
with fixed inputs, so repeated calls must return bit-identical outputs. The torch factories run
the fp32 reference (``dit.py`` / ``vae.py``) on the same work, built from the model's views, so
a lazy real-width model materialises only what the stage needs (block 0, not every block).

``ncnnport bench seedvr2 --preset real --layers 2 --perf`` times these stages on ncnn and torch
eager (the memory-bandwidth bound beside them).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

SIZES = ["256x256", "512x512"]
# ``dit_block`` is block 0 (a separate-weight mm block when the model has >= 2 blocks): pre
# graph, every window's attention, post graph; ``dit`` is the whole DiT.
STAGES: dict[str, list[str]] = {"dit_block": list(SIZES), "vae_encode": list(SIZES),
                                "vae_decode": list(SIZES), "dit": list(SIZES)}
# The speed table of ``make bench-perf``: the repeated unit of the DiT and the two VAE halves.
PERF_STAGES: dict[str, list[str]] = {"dit_block": list(SIZES), "vae_encode": list(SIZES),
                                     "vae_decode": list(SIZES)}

Call = Callable[[], list[np.ndarray]]


def bench_inputs(cfg: Any, size: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pixels x (1,3,1,H,W), DiT condition (1,h,w,33) and latent z (1,16,1,h,w) for ``size``."""
    h, w = (int(v) for v in size.lower().split("x"))
    s = cfg.vae.spatial_factor
    if h % (2 * s) or w % (2 * s):
        raise ValueError(f"bench size {size}: height and width must be multiples of {2 * s}")
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, 3, 1, h, w)).astype(np.float32)
    cond = rng.standard_normal((1, h // s, w // s, cfg.dit.vid_in_channels)).astype(np.float32)
    z = rng.standard_normal((1, cfg.vae.latent_channels, 1, h // s, w // s)).astype(np.float32)
    return x, cond, z


def _check(stage: str) -> None:
    if stage not in STAGES:
        raise NotImplementedError(f"model seedvr2 has no bench stage {stage!r}")


def ncnn_call(model: Any, backend: Any, stage: str, size: str) -> Call:
    """``backend`` is a ``runner.GraphBackend`` over the package's graphs."""
    from ncnnport.models.seedvr2.dit import timestep_sinusoid
    from ncnnport.models.seedvr2.runner import patchify_np

    _check(stage)
    cfg = model.config
    x, cond, z = bench_inputs(cfg, size)
    txt = model.text.numpy()
    if stage == "vae_encode":
        return lambda: list(backend.encode(x))
    if stage == "vae_decode":
        return lambda: [backend.decode(z)]
    if stage == "dit":
        return lambda: [backend.dit(cond, txt, cfg.timestep, {})]
    d = cfg.dit
    T, H, W, _ = cond.shape
    grid, L = (T, H // 2, W // 2), txt.shape[0]
    vid, tx = backend.get("dit_input").run([patchify_np(cond), np.ascontiguousarray(txt[None])])
    emb6 = backend.get("dit_embedding").run([timestep_sinusoid(cfg.timestep, d.sinusoidal_dim).numpy()[None]])[0]
    cos_t, sin_t = backend.geometry.text_tables(L)
    plan = backend.geometry.plan(grid, False, L)
    return lambda: list(backend.block(0, vid, tx, emb6, plan, cos_t, sin_t))


def torch_call(model: Any, stage: str, size: str) -> Call:
    """The fp32 reference on the same work, from views: ``vae_encode`` holds the encoder only,
    ``dit_block`` block 0 plus the input/embedding layers that make its inputs."""
    import torch

    from ncnnport.models.seedvr2.mmrope import text_positions

    _check(stage)
    cfg = model.config
    x, cond, z = bench_inputs(cfg, size)
    txt = model.text.numpy()
    if stage == "vae_encode":
        enc = model.view("vae", ["encoder"])

        def encode() -> list[np.ndarray]:
            with torch.inference_mode():
                return [o.numpy() for o in enc.encode_moments(torch.from_numpy(x))]
        return encode
    if stage == "vae_decode":
        dec = model.view("vae", ["decoder"])

        def decode() -> list[np.ndarray]:
            with torch.inference_mode():
                return [dec.decode(torch.from_numpy(z)).numpy()]
        return decode
    if stage == "dit":
        whole = model.dit

        def dit_call() -> list[np.ndarray]:
            with torch.inference_mode():
                return [whole(torch.from_numpy(cond), torch.from_numpy(txt), cfg.timestep).numpy()]
        return dit_call
    dit = model.view("dit", ["vid_in", "txt_in", "emb_in"])
    block = model.part("dit.blocks.0")
    T, H, W, _ = cond.shape
    grid, L = (T, H // 2, W // 2), txt.shape[0]
    with torch.inference_mode():
        v, t = dit.embed_inputs(torch.from_numpy(cond), torch.from_numpy(txt))
        emb = dit.emb_in(cfg.timestep)
        rope = block.attn.rope
        plan = dit.window_plan(grid, block.shifted, L, rope)
        tc, ts = rope.tables(torch.from_numpy(text_positions(L)))

    def call() -> list[np.ndarray]:
        with torch.inference_mode():
            return [o.numpy() for o in block(v, t, emb, plan, tc, ts)]
    return call


def stage_bytes(model: Any, stage: str) -> dict[str, int] | None:
    """Weight bytes one call must read at least (for the bandwidth bound; these stages are
    compute-bound at 256^2 and above, so the bound is a floor, not a target)."""
    from ncnnport.models.seedvr2.runner import block_names, decode_stage_names
    from ncnnport.models.seedvr2.specs import module_weight_bytes

    w = module_weight_bytes(model)
    names = {"dit_block": list(block_names(0)), "vae_encode": ["vae_encode"],
             "vae_decode": decode_stage_names(model.config), "dit": [n for n in w if n.startswith("dit_")]}
    return {"weights": sum(w[n] for n in names[stage])} if stage in names else None
