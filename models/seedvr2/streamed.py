"""Full-depth SeedVR2 parity holding one module of each side at a time (``parity --stream``).

Why: the real model is 14.6 GB of float32; the in-memory parity holds the whole torch reference,
every torch wrapper and every ncnn graph at once (9.7 GB peak at 2 DiT blocks), so at 32 blocks
it cannot run here. This walks one image through the pipeline with the reference's own modules
(``dit.py`` / ``vae.py``: the VAE encoder, the DiT input/embedding layers, each block, the output
head, the VAE decoder), each materialised from the lazy weight source, used and dropped, and the
ncnn graphs opened from the package, used and released. Both sides hand their activations on:

* ``<stage>/local``: the ncnn graph(s) of a stage fed exactly the torch side's input;
* ``<stage>`` (propagated): the ncnn chain on its own outputs from the pixels on.

Host steps (preprocess, noise, condition, Euler step, colour fix, clip) are the pipeline's own,
so differences come from the graphs alone. Peak RSS and time are measured per phase.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ncnnport.contract import Tolerance
from ncnnport.memory import PhaseMemory as Phases
from ncnnport.parity.records import stage_record


def _emb6(emb: torch.Tensor, dim: int) -> np.ndarray:
    """The reference's interleaved emb (6D) in the graphs' (1, 6, D) row layout."""
    return np.ascontiguousarray(emb.reshape(1, dim, 6).permute(0, 2, 1).numpy())


@torch.inference_mode()
def streamed_parity(model: Any, modules: Any, label: str, video: np.ndarray, seed: int, area: int,
                    tol_for: Callable[[str], Tolerance], local_tol: Tolerance) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Records and the per-phase receipt for one clip. ``modules`` is a ``LazyModules`` over the
    package (graphs opened on lookup, released here after use)."""
    from ncnnport.models.seedvr2.dit import unpatchify
    from ncnnport.models.seedvr2.mmrope import text_positions
    from ncnnport.models.seedvr2.pipeline import Noise, posterior_latent, preprocess, to_uint8, wavelet_color_fix
    from ncnnport.models.seedvr2.frames import image_rows, image_stats
    from ncnnport.models.seedvr2.runner import GraphBackend, block_names, decode_stage_names, patchify_np
    from ncnnport.models.seedvr2.vae import latent_frames

    cfg = model.config
    d, v = cfg.dit, cfg.vae
    ph = Phases()
    ncnn = GraphBackend(cfg, modules.__getitem__)
    recs: list[dict[str, Any]] = []
    x = preprocess(video, area)
    lat = (v.latent_channels, latent_frames(x.shape[1], v.temporal_factor),
           x.shape[2] // v.spatial_factor, x.shape[3] // v.spatial_factor)
    extra = {"streamed": True, "layers": d.num_layers, "frames_in": int(video.shape[0]),
             "size": list(x.shape[2:]), "latent_shape": list(lat)}

    def rec(stage: str, ref: Any, cand: Any, tol: Tolerance) -> None:
        recs.append(stage_record(label, stage, np.asarray(ref), np.asarray(cand), tol, **extra))

    # --- VAE encoder --------------------------------------------------------------------------
    def torch_encode() -> tuple[np.ndarray, np.ndarray]:
        enc = model.view("vae", ["encoder"])
        m, lv = enc.encode_moments(torch.from_numpy(x[None]))
        return m.numpy(), lv.numpy()

    ref_moments = ph.run("vae_encode_torch", torch_encode)
    cand_moments = ph.run("vae_encode_ncnn", lambda: ncnn.encode(x[None]))
    modules.release("vae_encode")
    noise = Noise.seeded(lat, seed)  # the official draws: posterior sampled, then x_T
    extra["noise"] = noise.record()
    ref_lat = posterior_latent(*ref_moments, noise, v.scaling_factor)
    cand_lat = posterior_latent(*cand_moments, noise, v.scaling_factor)
    rec("latent", ref_lat, cand_lat, tol_for("latent"))
    x_T = noise.x_T.transpose(1, 2, 3, 0)

    def cond_of(latent: np.ndarray) -> np.ndarray:
        lq = latent.transpose(1, 2, 3, 0)
        mask = np.ones(lq.shape[:3] + (1,), dtype=np.float32)
        return np.ascontiguousarray(np.concatenate([x_T, lq, mask], axis=-1), dtype=np.float32)

    ref_cond, cand_cond = cond_of(ref_lat), cond_of(cand_lat)
    txt = np.ascontiguousarray(model.text.numpy(), dtype=np.float32)
    T, H, W, _ = ref_cond.shape
    grid, L = (T, H // 2, W // 2), txt.shape[0]

    # --- DiT input + embedding + output head layers (one small view) ---------------------------
    head = ph.run("dit_io_view", lambda: model.view(
        "dit", ["vid_in", "txt_in", "emb_in", "vid_out_norm", "vid_out_ada", "vid_out"]))
    ref_vid, ref_txt = (t.numpy() for t in head.embed_inputs(torch.from_numpy(ref_cond), torch.from_numpy(txt)))
    emb = head.emb_in(cfg.timestep)
    ref_emb6 = _emb6(emb, d.vid_dim)

    def ncnn_inputs() -> tuple[np.ndarray, ...]:
        from ncnnport.models.seedvr2.dit import timestep_sinusoid

        local = modules["dit_input"].run([patchify_np(ref_cond), txt[None]])
        prop = modules["dit_input"].run([patchify_np(cand_cond), txt[None]])
        emb6 = modules["dit_embedding"].run([timestep_sinusoid(cfg.timestep, d.sinusoidal_dim).numpy()[None]])[0]
        return (*local, *prop, emb6)

    l_vid, l_txt, cand_vid, cand_txt, cand_emb6 = ph.run("dit_input_ncnn", ncnn_inputs)
    for name in ("dit_input", "dit_embedding"):
        modules.release(name)
    rec("vid_tokens/local", ref_vid, l_vid[0], local_tol)
    rec("txt_tokens/local", ref_txt, l_txt[0], local_tol)
    rec("emb6/local", ref_emb6, cand_emb6, local_tol)

    # --- every block: the reference block vs its pre + attention + post graphs -----------------
    cos_t, sin_t = ncnn.geometry.text_tables(L)
    plans = {s: ncnn.geometry.plan(grid, s, L) for s in (False, True)}
    ref_v, ref_t = torch.from_numpy(ref_vid), torch.from_numpy(ref_txt)
    for i in range(d.num_layers):
        def torch_block() -> tuple[torch.Tensor, torch.Tensor]:
            block = model.part(f"dit.blocks.{i}")
            rope = block.attn.rope
            plan = head.window_plan(grid, block.shifted, L, rope)
            tc, ts = rope.tables(torch.from_numpy(text_positions(L)))
            return block(ref_v, ref_t, emb, plan, tc, ts)

        new_v, new_t = ph.run(f"block_{i:02d}_torch", torch_block)

        def ncnn_block() -> tuple[np.ndarray, np.ndarray]:
            plan = plans[i % 2 == 1]
            local, _ = ncnn.block(i, ref_v.numpy()[None], ref_t.numpy()[None], ref_emb6, plan, cos_t, sin_t)
            prop = ncnn.block(i, cand_vid, cand_txt, cand_emb6, plan, cos_t, sin_t)
            return local, prop

        local, (cand_vid, cand_txt) = ph.run(f"block_{i:02d}_ncnn", ncnn_block)
        for name in block_names(i):
            modules.release(name)
        rec(f"block_{i:02d}/local", new_v, local[0], local_tol)
        rec(f"block_{i:02d}", new_v, cand_vid[0], tol_for("blocks"))
        ref_v, ref_t = new_v, new_t
    modules.release("dit_attention")

    ref_out = head.output_head(ref_v, emb).numpy()
    local_out = modules["dit_output"].run([ref_v.numpy()[None], ref_emb6])[0][0]
    cand_out = modules["dit_output"].run([cand_vid, cand_emb6])[0][0]
    modules.release("dit_output")
    head = None  # the input/embedding/output layers are not needed past this point
    rec("vid_out/local", ref_out, local_out, local_tol)
    rec("vid_out", ref_out, cand_out, tol_for("vid_out"))

    # --- Euler step, VAE decoder, colour fix, uint8 ---------------------------------------------
    def z_of(out: np.ndarray) -> np.ndarray:
        vel = unpatchify(torch.from_numpy(out), grid, d.vid_out_channels).numpy()
        x0 = (x_T - vel * (cfg.timestep / cfg.schedule_T)).astype(np.float32)
        return np.ascontiguousarray((x0 / v.scaling_factor).transpose(3, 0, 1, 2)[None], dtype=np.float32)

    ref_z, cand_z = z_of(ref_out), z_of(cand_out)

    def torch_decode() -> np.ndarray:
        dec = model.view("vae", ["decoder"])
        return dec.decode(torch.from_numpy(ref_z))[0].numpy()

    ref_dec = ph.run("vae_decode_torch", torch_decode)
    local_dec, cand_dec = ph.run("vae_decode_ncnn", lambda: (ncnn.decode(ref_z)[0], ncnn.decode(cand_z)[0]))
    for name in decode_stage_names(cfg):
        modules.release(name)
    rec("decoded/local", ref_dec, local_dec, local_tol)
    rec("decoded", ref_dec, cand_dec, tol_for("decoded"))  # unclipped: colour fix first, clip in to_uint8
    n_in = video.shape[0]
    ref_frames = to_uint8(wavelet_color_fix(ref_dec, x))[:n_in]
    cand_frames = to_uint8(wavelet_color_fix(cand_dec, x))[:n_in]
    recs.append(stage_record(label, "frames", image_rows(ref_frames), image_rows(cand_frames), tol_for("frames"),
                             **extra, **image_stats(ref_frames, cand_frames)))
    return recs, {"phases": ph.phases, **ph.peak()}
