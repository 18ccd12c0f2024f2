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
from ncnnport.parity.streamed import Chain, ChainStage, run_chain


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
    from ncnnport.models.seedvr2.runner import GraphBackend, block_names, patchify_np
    from ncnnport.models.seedvr2.vae import latent_frames

    cfg = model.config
    d, v = cfg.dit, cfg.vae
    ph = Phases()
    ncnn = GraphBackend(cfg, modules.__getitem__, has=modules.__contains__)
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
    for name in ncnn.stage_graphs("encode"):  # the general graph and its image twin
        modules.release(name)
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
    # state: reference (video, text) tensors; ncnn (video, text, emb6) arrays with the batch axis
    cos_t, sin_t = ncnn.geometry.text_tables(L)
    plans = {s: ncnn.geometry.plan(grid, s, L) for s in (False, True)}

    def block_stage(i: int) -> ChainStage:
        def reference(state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            block = model.part(f"dit.blocks.{i}")
            rope = block.attn.rope
            plan = head.window_plan(grid, block.shifted, L, rope)
            tc, ts = rope.tables(torch.from_numpy(text_positions(L)))
            return block(*state, emb, plan, tc, ts)

        def graphs(state: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, ...]:
            vid, txt, emb6 = state
            return (*ncnn.block(i, vid, txt, emb6, plans[i % 2 == 1], cos_t, sin_t), emb6)

        return ChainStage(f"block_{i:02d}", reference, graphs, block_names(i), tol=tol_for("blocks"),
                          local_tol=local_tol, to_ncnn=lambda r: (r[0].numpy()[None], r[1].numpy()[None], ref_emb6),
                          compare_ref=lambda r: r[0], compare_ncnn=lambda c: c[0][0])

    chain = Chain(label, ph, modules, extra, recs)
    (ref_v, _), (cand_vid, _, _) = run_chain(chain, [block_stage(i) for i in range(d.num_layers)],
                                             (torch.from_numpy(ref_vid), torch.from_numpy(ref_txt)),
                                             (cand_vid, cand_txt, cand_emb6))
    modules.release("dit_attention")

    def output_graph(state: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        return modules["dit_output"].run(list(state))[0][0]

    ref_out, cand_out = run_chain(chain, [ChainStage(
        "vid_out", lambda v_: head.output_head(v_, emb).numpy(), output_graph, ["dit_output"],
        tol=tol_for("vid_out"), local_tol=local_tol, to_ncnn=lambda v_: (v_.numpy()[None], ref_emb6),
        phase="dit_output")], ref_v, (cand_vid, cand_emb6))
    head = None  # the input/embedding/output layers are not needed past this point

    # --- Euler step, VAE decoder, colour fix, uint8 ---------------------------------------------
    def z_of(out: np.ndarray) -> np.ndarray:
        vel = unpatchify(torch.from_numpy(out), grid, d.vid_out_channels).numpy()
        x0 = (x_T - vel * (cfg.timestep / cfg.schedule_T)).astype(np.float32)
        return np.ascontiguousarray((x0 / v.scaling_factor).transpose(3, 0, 1, 2)[None], dtype=np.float32)

    def torch_decode(z: np.ndarray) -> np.ndarray:
        dec = model.view("vae", ["decoder"])
        return dec.decode(torch.from_numpy(z))[0].numpy()

    # unclipped: colour fix first, clip in to_uint8
    ref_dec, cand_dec = run_chain(chain, [ChainStage(
        "decoded", torch_decode, lambda z: ncnn.decode(z)[0], ncnn.stage_graphs("decode"), tol=tol_for("decoded"),
        local_tol=local_tol, phase="vae_decode")], z_of(ref_out), z_of(cand_out))
    n_in = video.shape[0]
    ref_frames = to_uint8(wavelet_color_fix(ref_dec, x))[:n_in]
    cand_frames = to_uint8(wavelet_color_fix(cand_dec, x))[:n_in]
    recs.append(stage_record(label, "frames", image_rows(ref_frames), image_rows(cand_frames), tol_for("frames"),
                             **extra, **image_stats(ref_frames, cand_frames)))
    return recs, {"phases": ph.phases, **ph.peak()}
