"""Host side of the exported SeedVR2: drives the per-module graphs through any runner with
``.run(list[np.ndarray]) -> list[np.ndarray]`` (``NcnnModule`` or ``TorchModule``).

The host does what the graphs cannot: patchify/unpatchify, the timestep sinusoid, the window
partition (gather each window's Q/K/V rows, scatter outputs, average text over windows),
window-local RoPE tables, and the VAE's depth-to-space between decoder graphs. Every host step
is data movement or the same float32 arithmetic as the reference, so torch-vs-ncnn differences
come from the graphs alone.

Torch-free: the RoPE and timestep tables come from a :class:`Trig` source, torch's own
functions on the torch run path (:class:`TorchTrig`) or the package's lookup tables
(``host_numpy.TrigTables``) on ``run --package``; both give the same float32 values.

Residency: ``resident`` keeps every graph loaded; ``streamed`` loads a block's two graphs right
before use and releases them right after (peak memory of one block), same numbers bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from ncnnport.models.seedvr2.config import SeedVR2Config
from ncnnport.models.seedvr2.host_numpy import depth_to_space, pair_to_half_perm, rope_rows
from ncnnport.models.seedvr2.windows import (partition, text_positions, video_positions, window_local_positions,
                                             window_token_index)

Runner = Any  # has .run(list[np.ndarray]) -> list[np.ndarray]


class Trig(Protocol):
    """Where the host's RoPE angles and timestep sinusoid come from."""

    def angles(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin of ``positions * freq_k`` for integer ``positions`` -> positions.shape + (F,)."""

    def timestep_sinusoid(self, t: float) -> np.ndarray:
        """The ``dit_embedding`` input ``[sin(t f_i), cos(t f_i)]``."""


class TorchTrig:
    """Torch's float32 cos/sin/exp, as the reference computes them (frequencies as the
    checkpoint's ``rope.rope.freqs`` buffers; ``port.load`` checks a checkpoint holds exactly
    these)."""

    def __init__(self, cfg: SeedVR2Config) -> None:
        from ncnnport.models.seedvr2.mmrope import rope_freqs

        self.cfg = cfg
        self.freqs = rope_freqs(cfg.dit.rope_axis_dim, cfg.dit.rope_theta)

    def angles(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import torch

        ang = torch.from_numpy(np.asarray(positions)).to(torch.float32)[..., None] * self.freqs
        return ang.cos().numpy(), ang.sin().numpy()

    def timestep_sinusoid(self, t: float) -> np.ndarray:
        from ncnnport.models.seedvr2.dit import timestep_sinusoid

        return timestep_sinusoid(t, self.cfg.dit.sinusoidal_dim).numpy()


def block_names(i: int) -> tuple[str, str]:
    return f"dit_block_{i:02d}_pre", f"dit_block_{i:02d}_post"


def decode_stage_names(cfg: SeedVR2Config) -> list[str]:
    return [f"vae_decode_{k}" for k in range(len(cfg.vae.block_out_channels))]


IMAGE_SUFFIX = "_image"


def image_graph(name: str) -> str:
    """The single-frame twin of VAE graph ``name`` (``vae_encode`` -> ``vae_encode_image``).

    Why twins: the folded causal 3-D conv of a general graph concatenates its ``kt`` temporal
    taps along channels, and with ONE frame every tap reads that frame (the causal padding
    repeats frame 0), so the general graph runs ``kt`` (3) times the multiply-adds of the
    convolution it stands for. The twin sums the taps' weights once at export
    (``conv_fold.FoldedConv3d(single_frame=True)``): the same function at T = 1, a third of the
    work and weights of every 3x3x3 conv. Images (T = 1) take the twins when the package has
    them; clips take the general graphs."""
    return name + IMAGE_SUFFIX


def vae_graph_names(cfg: SeedVR2Config) -> list[str]:
    """The general VAE graphs, each of which has an :func:`image_graph` twin."""
    return ["vae_encode", *decode_stage_names(cfg)]


def decode_stage_temporal(cfg: SeedVR2Config) -> list[bool]:
    """Whether the upsample after decoder stage k is space-time (else spatial-only)."""
    n = len(cfg.vae.block_out_channels)
    return [(n - 2 - k) in cfg.vae.temporal_down_blocks for k in range(n - 1)]


def patchify_np(vid: np.ndarray) -> np.ndarray:
    """(T, H, W, C) -> (1, T*h*w, 4C), feature (py*2+px)*C + c (as the reference)."""
    t, h, w, c = vid.shape
    x = vid.reshape(t, h // 2, 2, w // 2, 2, c).transpose(0, 1, 3, 2, 4, 5)
    return np.ascontiguousarray(x.reshape(1, t * (h // 2) * (w // 2), 4 * c), dtype=np.float32)


def unpatchify_np(x: np.ndarray, grid: tuple[int, int, int], c: int) -> np.ndarray:
    t, h, w = grid
    y = x.reshape(t, h, w, 2, 2, c).transpose(0, 1, 3, 2, 4, 5)
    return np.ascontiguousarray(y.reshape(t, 2 * h, 2 * w, c))


@dataclass
class Plan:
    """One partition (regular or shifted) of a grid, ready for the graphs."""

    index: list[np.ndarray]      # raster token indices per window
    cos_v: np.ndarray            # (1, N, hd) rotate-half layout, each token's local position
    sin_v: np.ndarray


class DiTGeometry:
    """Window plans and RoPE tables for a config, from ``trig`` (default: torch's functions)."""

    def __init__(self, cfg: SeedVR2Config, trig: Trig | None = None) -> None:
        self.cfg = cfg
        self.trig = trig if trig is not None else TorchTrig(cfg)
        self.perm = pair_to_half_perm(cfg.dit.head_dim)

    def _tables(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and SIGNED sin ``[-sin, sin]`` in rotate-half channel order (see wrappers) of the
        pair-layout tables ``mmrope.MMRoPE3d.tables`` gives for ``pos`` [n, 3]."""
        c, s = rope_rows(*self.trig.angles(pos), self.cfg.dit.head_dim)
        c, s = c[:, self.perm], s[:, self.perm].copy()
        s[:, : s.shape[1] // 2] *= -1.0
        return np.ascontiguousarray(c), s

    def text_tables(self, text_len: int) -> tuple[np.ndarray, np.ndarray]:
        c, s = self._tables(text_positions(text_len))
        return c[None], s[None]

    def plan(self, grid: tuple[int, int, int], shifted: bool, text_len: int) -> Plan:
        d = self.cfg.dit
        wins = partition(grid, shifted, d.window, d.window_area, d.window_max_t)
        index = window_token_index(grid, wins)
        n = int(np.prod(grid))
        pos = np.zeros((n, 3), dtype=np.int64)
        for idx, local in zip(index, window_local_positions(wins)):
            pos[idx] = video_positions(local, text_len)
        c, s = self._tables(pos)
        return Plan(index, c[None], s[None])


class GraphBackend:
    """The pipeline Backend over per-module runners.

    ``get(name)`` returns a runner; ``release(name)`` frees it; ``has(name)`` says whether the
    package holds a graph without opening it (``None``: only the general graphs are used). One
    frame (an image) runs on the VAE's :func:`image_graph` twins when ``has`` finds them. With ``streamed=True`` the DiT
    block graphs are fetched right before use and released after. With ``release_stages=True``
    (``run --low-memory``) the graphs of a pipeline stage are released once the stage is done
    (:meth:`stage_done`): at 720p the process otherwise held the encoder's, the DiT's and the
    decoder's weights at once while decoding (ncnn keeps the VAE's 3x3 kernels in Winograd form,
    4x their file size), 9.6 GB against torch's 3.8.
    """

    def __init__(self, cfg: SeedVR2Config, get: Callable[[str], Runner],
                 release: Callable[[str], None] | None = None, streamed: bool = False,
                 trig: Trig | None = None, release_stages: bool = False,
                 has: Callable[[str], bool] | None = None) -> None:
        self.cfg, self.get, self.release, self.streamed = cfg, get, release, streamed
        self.has = has
        self.release_stages = release_stages
        self.geometry = DiTGeometry(cfg, trig)

    def stage_graphs(self, stage: str) -> list[str]:
        """The graph names pipeline ``stage`` (``host.STAGES``) runs."""
        if stage == "encode":
            return self._with_twins(["vae_encode"])
        if stage == "decode":
            return self._with_twins(decode_stage_names(self.cfg))
        if stage == "dit":
            return ["dit_input", "dit_embedding", "dit_attention", "dit_output",
                    *(name for i in range(self.cfg.dit.num_layers) for name in block_names(i))]
        raise ValueError(f"unknown pipeline stage {stage!r}")

    def stage_done(self, stage: str) -> None:
        """Release ``stage``'s graphs when stages are released (a later call reopens them)."""
        if self.release_stages and self.release is not None:
            for name in self.stage_graphs(stage):
                self.release(name)

    def _with_twins(self, names: list[str]) -> list[str]:
        return names + [image_graph(n) for n in names if self.has is not None and self.has(image_graph(n))]

    def vae_graph(self, name: str, frames: int) -> str:
        """The graph that runs VAE graph ``name`` on ``frames`` frames: its image twin for one
        frame when the package has it, else ``name``."""
        if frames == 1 and self.has is not None and self.has(image_graph(name)):
            return image_graph(name)
        return name

    def encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        name = self.vae_graph("vae_encode", x.shape[2])
        mean, logvar = self.get(name).run([np.ascontiguousarray(x, dtype=np.float32)])
        return mean, logvar

    def decode(self, z: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(z, dtype=np.float32)
        names, temporal = decode_stage_names(self.cfg), decode_stage_temporal(self.cfg)
        frames = x.shape[2]  # every stage keeps one frame when the latent has one (2f-1 = 1)
        for k, name in enumerate(names):
            x = self.get(self.vae_graph(name, frames)).run([x])[0]
            if k < len(temporal):
                x = depth_to_space(x, temporal[k])
        return x

    def _attention(self, attn: Runner, qv, kv, vv, qt, kt, vt, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
        """Per window: [window video rows, all text rows] -> scatter video, average text."""
        out_v = np.zeros_like(qv)
        acc_t = np.zeros_like(qt)
        for idx in plan.index:
            q = np.concatenate([qv[:, idx], qt], axis=1)
            k = np.concatenate([kv[:, idx], kt], axis=1)
            v = np.concatenate([vv[:, idx], vt], axis=1)
            o = attn.run([q, k, v])[0]
            out_v[:, idx] = o[:, : len(idx)]
            acc_t = acc_t + o[:, len(idx):]
        return out_v, (acc_t / np.float32(len(plan.index))).astype(np.float32)

    def block(self, i: int, vid: np.ndarray, tx: np.ndarray, emb6: np.ndarray, plan: Plan,
              cos_t: np.ndarray, sin_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """DiT block ``i``: pre graph, windowed attention, post graph (streamed: each block graph
        is fetched right before its call and released right after)."""
        pre_name, post_name = block_names(i)
        pre = self.get(pre_name)
        qv, kv, vv, qt, kt, vt = pre.run([vid, tx, emb6, plan.cos_v, plan.sin_v, cos_t, sin_t])
        del pre
        if self.streamed and self.release:
            self.release(pre_name)
        attn_v, attn_t = self._attention(self.get("dit_attention"), qv, kv, vv, qt, kt, vt, plan)
        attn_v = attn_v.reshape(1, attn_v.shape[1], -1)
        attn_t = attn_t.reshape(1, attn_t.shape[1], -1)
        post = self.get(post_name)
        if i == self.cfg.dit.num_layers - 1:
            vid = post.run([vid, emb6, attn_v])[0]
        else:
            vid, tx = post.run([vid, tx, emb6, attn_v, attn_t])
        del post
        if self.streamed and self.release:
            self.release(post_name)
        return vid, tx

    def dit(self, cond: np.ndarray, txt: np.ndarray, t: float, stages: dict[str, np.ndarray]) -> np.ndarray:
        d = self.cfg.dit
        T, H, W, _ = cond.shape
        grid = (T, H // 2, W // 2)
        L = txt.shape[0]
        vid, tx = self.get("dit_input").run([patchify_np(cond), np.ascontiguousarray(txt[None], dtype=np.float32)])
        stages["vid_tokens"], stages["txt_tokens"] = vid[0], tx[0]
        sinusoid = np.ascontiguousarray(self.geometry.trig.timestep_sinusoid(t), dtype=np.float32)
        emb6 = self.get("dit_embedding").run([sinusoid[None]])[0]
        stages["emb"] = np.ascontiguousarray(emb6[0].T.reshape(-1))  # back to the interleaved layout
        cos_t, sin_t = self.geometry.text_tables(L)
        plans = {s: self.geometry.plan(grid, s, L) for s in (False, True)}
        for i in range(d.num_layers):
            vid, tx = self.block(i, vid, tx, emb6, plans[i % 2 == 1], cos_t, sin_t)
            stages[f"block_{i:02d}"] = vid[0]
        out = self.get("dit_output").run([vid, emb6])[0]
        stages["vid_out"] = out[0]
        vel = unpatchify_np(out[0], grid, d.vid_out_channels)
        stages["velocity"] = vel
        return vel


def torch_runners(specs: Mapping[str, Any]) -> dict[str, Runner]:
    """TorchModule runners over every spec's wrapper (same interface as the ncnn graphs)."""
    from ncnnport.runtime.session import TorchModule

    return {name: TorchModule(spec.build(), spec.to_json()) for name, spec in specs.items()}
