"""Activation statistics of a seeded SeedVR2 at real width, one DiT block in memory at a time.

Why: a seeded stand-in is only a useful parity subject if its activations look like a working
network's: O(1) residual streams that every block changes measurably, non-degenerate attention
and decoded pixels mostly inside [-1, 1]. Too small an init makes the DiT the identity (parity
then compares near-constant tensors and hides errors); too large saturates softmax and the
final clip. This walks the reference (``dit.py``'s block forward, not the export wrappers) over
one image with weights from a per-tensor rule, building each block from its own tensors and
dropping it, so the full 32-block model runs in ~1.5 GB.

``measure(build(PORT.truncate(REAL, K), "seeded"), fixture.video(), fixture.seed).table()`` gives
one row per stage (rms, max|x|, the relative update of each block, the mean largest softmax
weight of the first window, the share of decoded values the final clip would cut); the numbers
measured for the real preset are in :mod:`.seeded`'s docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ncnnport.lazy_weights import Init
from ncnnport.models.seedvr2.config import SeedVR2Config
from ncnnport.models.seedvr2.dit import emb_table, patchify, unpatchify
from ncnnport.models.seedvr2.lazy import LazySeedVR2
from ncnnport.models.seedvr2.mmrope import text_positions


def std002_rule(name: str, shape: tuple[int, ...]) -> Init:
    """The width-blind alternative (HF-style ``N(0, 0.02)`` matrices, zero biases, unit norms,
    modulation as the seeded rule), to show what the fan-in scaling buys."""
    from ncnnport.models.seedvr2.seeded import init_rule

    if len(shape) >= 2 and not name.startswith("text."):
        return Init(0.0, 0.02)
    return init_rule(name, shape)


RECIPES = {"seeded": None, "std002": std002_rule}  # None: the preset's own rule


def build(config: SeedVR2Config, recipe: str, seed: int = 0) -> LazySeedVR2:
    from ncnnport.models.seedvr2 import lazy

    return lazy.seeded(config, seed, rule=RECIPES[recipe])


def _rms(x: torch.Tensor) -> float:
    return float(x.double().pow(2).mean().sqrt())


@dataclass
class Stats:
    """Per-stage numbers: rms and max|x| of the streams, the relative update of each block."""

    rows: list[dict[str, float | str]] = field(default_factory=list)

    def add(self, stage: str, **values: float) -> None:
        self.rows.append({"stage": stage, **{k: round(v, 4) for k, v in values.items()}})

    def table(self) -> str:
        keys = sorted({k for r in self.rows for k in r if k != "stage"}, key=lambda k: list(
            dict.fromkeys(k2 for r in self.rows for k2 in r)).index(k))
        lines = ["| stage | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        for r in self.rows:
            lines.append(f"| {r['stage']} | " + " | ".join(str(r.get(k, "")) for k in keys) + " |")
        return "\n".join(lines)


def _attention_peak(block, vid_n: torch.Tensor, txt_n: torch.Tensor, plan, tc, ts) -> float:
    """Mean over heads and queries of the largest softmax weight in the first window (1/S for
    uniform attention, 1.0 for one-hot): the saturation check."""
    from ncnnport.models.seedvr2.mmrope import apply_rope

    a = block.attn
    qv, kv, _ = a.qkv(vid_n, "vid")
    qt, kt, _ = a.qkv(txt_n, "txt")
    idx, cos, sin = plan.index[0], plan.cos[0], plan.sin[0]
    q = torch.cat([apply_rope(qv[idx], cos[:, None], sin[:, None]), apply_rope(qt, tc[:, None], ts[:, None])])
    k = torch.cat([apply_rope(kv[idx], cos[:, None], sin[:, None]), apply_rope(kt, tc[:, None], ts[:, None])])
    logits = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(a.head_dim)
    return float(logits.softmax(-1).amax(-1).mean())


def measure(model: LazySeedVR2, frames: np.ndarray, seed: int) -> Stats:
    """One image through the VAE encoder, every DiT block (built and dropped one by one), the
    output head and the decoder; statistics after each stage."""
    from ncnnport.models.seedvr2.dit import rms_norm
    from ncnnport.models.seedvr2.pipeline import Noise, preprocess

    cfg = model.config
    d = cfg.dit
    st = Stats()
    x = preprocess(frames, frames.shape[1] * frames.shape[2])
    with torch.inference_mode():
        enc = model.view("vae", ["encoder"])
        m = enc.encoder(torch.from_numpy(x[None]))
        del enc
        latent = m[0, : cfg.vae.latent_channels] * cfg.vae.scaling_factor
        st.add("vae latent", rms=_rms(latent), absmax=float(latent.abs().max()))
        noise = Noise.seeded(tuple(latent.shape), seed)
        lq = latent.permute(1, 2, 3, 0)
        cond = torch.cat([torch.from_numpy(noise.x_T).permute(1, 2, 3, 0), lq,
                          torch.ones(lq.shape[:3] + (1,))], dim=-1)
        dit = model.view("dit", ["vid_in", "txt_in", "emb_in", "vid_out_norm", "vid_out_ada", "vid_out"])
        txt = model.text
        vid, tx = dit.vid_in.proj(patchify(cond)), dit.txt_in(txt)
        st.add("input tokens", rms=_rms(vid), absmax=float(vid.abs().max()), txt_rms=_rms(tx))
        emb = dit.emb_in(cfg.timestep)
        e = emb_table(emb, d.vid_dim)
        st.add("emb (A-terms)", rms=_rms(emb), absmax=float(emb.abs().max()),
               attn_gate_rms=_rms(e[:, 0, 2]), mlp_gate_rms=_rms(e[:, 1, 2]), attn_scale_rms=_rms(e[:, 0, 1]))
        grid = dit.grid(tuple(cond.shape))
        L = txt.shape[0]
        for i in range(d.num_layers):
            block = model.part(f"dit.blocks.{i}")
            rope = block.attn.rope
            plan = dit.window_plan(grid, block.shifted, L, rope)
            tc, ts = rope.tables(torch.from_numpy(text_positions(L)))
            vid_n = block.ada.get("vid").modulate_in(rms_norm(vid, d.norm_eps), e, "attn", 0)
            txt_n = rms_norm(tx, d.norm_eps)
            if not block.is_last:
                txt_n = block.ada.get("txt").modulate_in(txt_n, e, "attn", 0)
            peak = _attention_peak(block, vid_n, txt_n, plan, tc, ts)
            v2, t2 = block(vid, tx, emb, plan, tc, ts)
            st.add(f"block {i:02d}", rms=_rms(v2), absmax=float(v2.abs().max()),
                   update=_rms(v2 - vid) / max(_rms(vid), 1e-12), txt_rms=_rms(t2), attn_peak=peak)
            vid, tx = v2, t2
            del block
        out = dit.output_head(vid, emb)
        st.add("velocity", rms=_rms(out), absmax=float(out.abs().max()))
        del dit
        x0 = torch.from_numpy(noise.x_T).permute(1, 2, 3, 0) - unpatchify(out, grid, d.vid_out_channels)
        z = (x0 / cfg.vae.scaling_factor).permute(3, 0, 1, 2)[None]
        dec = model.view("vae", ["decoder"]).decoder(z.contiguous())
        st.add("decoded", rms=_rms(dec), absmax=float(dec.abs().max()),
               clipped=float((dec.abs() > 1).float().mean()))
    return st
