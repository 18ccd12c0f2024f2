"""NaDiT reference (SeedVR2 3B transformer), fp32, batch 1, written from the spec.

Tokens are flattened: video ``[N, D]`` in (t, h, w) raster order of the patched grid, text
``[L, D]``. Module and parameter names follow the official checkpoint so a real state dict loads
strictly (``blocks.i.attn.proj_qkv.vid.weight``, ``blocks.i.ada.all.attn_scale``,
``blocks.i.attn.rope.rope.freqs``, ``vid_out_ada.out_shift``, ...).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ncnnport.models.seedvr2.config import DiTConfig
from ncnnport.models.seedvr2.mmrope import MMRoPE3d, apply_rope, text_positions, video_positions
from ncnnport.models.seedvr2.windows import partition, window_local_positions, window_token_index

ATTN, MLP = 0, 1            # modulation layer slot
SHIFT, SCALE, GATE = 0, 1, 2


def rms_norm(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm over the last axis in fp32 (weightless for the block norms)."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * weight if weight is not None else y


class RMSNorm(nn.Module):
    """RMSNorm with a learned weight (QK norms, output norm)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.eps, self.weight)


class MMModule(nn.Module):
    """One module per stream (``.vid``/``.txt``) or one shared (``.all``); ``vid_only`` drops the
    text copy (the last block's ada/mlp). The attribute names are the checkpoint's."""

    def __init__(self, make: Callable[[], nn.Module], shared: bool, vid_only: bool = False) -> None:
        super().__init__()
        self.shared = shared
        if shared:
            self.all = make()
        else:
            self.vid = make()
            if not vid_only:
                self.txt = make()

    def get(self, branch: str) -> nn.Module:
        if self.shared:
            return self.all
        return self.vid if branch == "vid" else self.txt


class AdaSingle(nn.Module):
    """Learned B-terms of the adaptive modulation; A-terms come from the time embedding.

    emb is read interleaved as ``[D, 2, 3]`` (layer attn/mlp, then shift/scale/gate): taking
    contiguous chunks instead is the classic wrong reading.
    """

    def __init__(self, dim: int, layers: tuple[str, ...] = ("attn", "mlp"),
                 modes: tuple[str, ...] = ("in", "out")) -> None:
        super().__init__()
        self.dim = dim
        for layer in layers:
            if "in" in modes:
                setattr(self, f"{layer}_shift", nn.Parameter(torch.zeros(dim)))
                setattr(self, f"{layer}_scale", nn.Parameter(torch.ones(dim)))
            if "out" in modes:
                setattr(self, f"{layer}_gate", nn.Parameter(torch.zeros(dim)))

    def modulate_in(self, x: torch.Tensor, emb3: torch.Tensor, layer: str, slot: int) -> torch.Tensor:
        """``x*(scaleA+scaleB) + (shiftA+shiftB)`` (no "1 +")."""
        scale = emb3[:, slot, SCALE] + getattr(self, f"{layer}_scale")
        shift = emb3[:, slot, SHIFT] + getattr(self, f"{layer}_shift")
        return x * scale + shift

    def modulate_out(self, x: torch.Tensor, emb3: torch.Tensor, layer: str, slot: int) -> torch.Tensor:
        return x * (emb3[:, slot, GATE] + getattr(self, f"{layer}_gate"))


def emb_table(emb: torch.Tensor, dim: int) -> torch.Tensor:
    """``[6D]`` -> ``[D, 2, 3]``: emb[d*6 + l*3 + g]."""
    return emb.reshape(dim, 2, 3)


class SwiGLUMLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.proj_in_gate = nn.Linear(dim, hidden, bias=False)
        self.proj_out = nn.Linear(hidden, dim, bias=False)
        self.proj_in = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj_out(F.silu(self.proj_in_gate(x)) * self.proj_in(x))


class TimeEmbedding(nn.Module):
    """Sinusoid [sin, cos] of 256 -> Linear, SiLU, Linear, SiLU, Linear -> 6D."""

    def __init__(self, sinusoidal_dim: int, hidden: int, out: int) -> None:
        super().__init__()
        self.sinusoidal_dim = sinusoidal_dim
        self.proj_in = nn.Linear(sinusoidal_dim, hidden)
        self.proj_hid = nn.Linear(hidden, hidden)
        self.proj_out = nn.Linear(hidden, out)

    def mlp(self, sinus: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.proj_in(sinus))
        h = F.silu(self.proj_hid(h))
        return self.proj_out(h)

    def forward(self, t: float) -> torch.Tensor:
        """The host-built sinusoid moved to the weights' device (a no-op on the CPU)."""
        return self.mlp(timestep_sinusoid(t, self.sinusoidal_dim).to(self.proj_in.weight.device))


def timestep_sinusoid(t: float, dim: int = 256) -> torch.Tensor:
    """``[sin(t f_i), cos(t f_i)]``, f_i = exp(-ln(1e4) i / (dim/2)) (flip_sin_to_cos False)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = torch.tensor(float(t), dtype=torch.float32) * freqs
    return torch.cat([torch.sin(args), torch.cos(args)])


class PatchIn(nn.Module):
    def __init__(self, features: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(features, dim)


class PatchOut(nn.Module):
    def __init__(self, dim: int, features: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, features)


def patchify(vid: torch.Tensor, ph: int = 2, pw: int = 2) -> torch.Tensor:
    """(T, H, W, C) channels-last -> (T*h*w, ph*pw*C) with feature (py*pw + px)*C + c."""
    t, h, w, c = vid.shape
    x = vid.reshape(t, h // ph, ph, w // pw, pw, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(t * (h // ph) * (w // pw), ph * pw * c)


def unpatchify(x: torch.Tensor, grid: tuple[int, int, int], c: int, ph: int = 2, pw: int = 2) -> torch.Tensor:
    """Inverse of :func:`patchify`: (t*h*w, ph*pw*c) -> (t, h*ph, w*pw, c)."""
    t, h, w = grid
    y = x.reshape(t, h, w, ph, pw, c).permute(0, 1, 3, 2, 4, 5)
    return y.reshape(t, h * ph, w * pw, c)


@dataclass
class WindowPlan:
    """Token indices and window-local RoPE tables of one partition (shared by all blocks of the
    same parity)."""

    index: list[torch.Tensor]
    cos: list[torch.Tensor]
    sin: list[torch.Tensor]


class NaSwinAttention(nn.Module):
    def __init__(self, cfg: DiTConfig, shared: bool) -> None:
        super().__init__()
        inner = cfg.heads * cfg.head_dim
        self.heads, self.head_dim, self.eps = cfg.heads, cfg.head_dim, cfg.norm_eps
        self.proj_qkv = MMModule(lambda: nn.Linear(cfg.vid_dim, inner * 3, bias=False), shared)
        self.proj_out = MMModule(lambda: nn.Linear(inner, cfg.vid_dim), shared)
        self.norm_q = MMModule(lambda: RMSNorm(cfg.head_dim, cfg.norm_eps), shared)
        self.norm_k = MMModule(lambda: RMSNorm(cfg.head_dim, cfg.norm_eps), shared)
        self.rope = MMRoPE3d(cfg.head_dim, cfg.rope_axis_dim, cfg.rope_theta)
        # None: attention in the input dtype (the fp32 reference). bfloat16: the official
        # numerics, which cast the concatenated Q/K/V to bf16 before attention (attention_dtype).
        self.attn_dtype: torch.dtype | None = None

    def qkv(self, x: torch.Tensor, branch: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """QKV Linear, split (L, 3, H, hd), per-head RMSNorm of Q and K (weight shared by heads)."""
        qkv = self.proj_qkv.get(branch)(x).reshape(x.shape[0], 3, self.heads, self.head_dim)
        q, k, v = qkv.unbind(1)
        return self.norm_q.get(branch)(q), self.norm_k.get(branch)(k), v

    def forward(self, vid: torch.Tensor, txt: torch.Tensor, plan: WindowPlan,
                txt_cos: torch.Tensor, txt_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Window attention: each window attends over [its video tokens, all text tokens].

        Video outputs go back to their raster slots; text outputs are averaged over windows.
        Returns the pre-``proj_out`` outputs flattened to (tokens, heads*head_dim).
        """
        qv, kv, vv = self.qkv(vid, "vid")
        qt, kt, vt = self.qkv(txt, "txt")
        qt = apply_rope(qt, txt_cos[:, None], txt_sin[:, None])
        kt = apply_rope(kt, txt_cos[:, None], txt_sin[:, None])
        vid_out = torch.zeros_like(qv)
        txt_acc = torch.zeros_like(qt)
        n_txt = txt.shape[0]
        for idx, cos, sin in zip(plan.index, plan.cos, plan.sin):
            q = torch.cat([apply_rope(qv[idx], cos[:, None], sin[:, None]), qt])
            k = torch.cat([apply_rope(kv[idx], cos[:, None], sin[:, None]), kt])
            v = torch.cat([vv[idx], vt])
            if self.attn_dtype is not None:
                q, k, v = q.to(self.attn_dtype), k.to(self.attn_dtype), v.to(self.attn_dtype)
            o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                               scale=1.0 / math.sqrt(self.head_dim)).transpose(0, 1)
            if self.attn_dtype is not None:
                o = o.to(qv.dtype)
            vid_out[idx] = o[: o.shape[0] - n_txt]
            txt_acc = txt_acc + o[o.shape[0] - n_txt:]
        txt_out = txt_acc / len(plan.index)
        return vid_out.flatten(1), txt_out.flatten(1)


@contextmanager
def attention_dtype(model: nn.Module, dtype: torch.dtype | None) -> Iterator[None]:
    """Every window attention of ``model`` casts Q/K/V to ``dtype`` inside the block (restored on
    exit). The official dit_v2 attention does this with bf16; the fp32 reference must not."""
    attns = [m for m in model.modules() if isinstance(m, NaSwinAttention)]
    before = [m.attn_dtype for m in attns]
    for m in attns:
        m.attn_dtype = dtype
    try:
        yield
    finally:
        for m, d in zip(attns, before):
            m.attn_dtype = d


class NaMMSRTransformerBlock(nn.Module):
    def __init__(self, cfg: DiTConfig, index: int) -> None:
        super().__init__()
        shared = cfg.shared_weights(index)
        self.is_last = cfg.is_last(index)
        self.shifted = index % 2 == 1
        self.dim, self.eps = cfg.vid_dim, cfg.norm_eps
        self.attn = NaSwinAttention(cfg, shared)
        self.mlp = MMModule(lambda: SwiGLUMLP(cfg.vid_dim, cfg.mlp_hidden), shared, vid_only=self.is_last)
        self.ada = MMModule(lambda: AdaSingle(cfg.vid_dim), shared, vid_only=self.is_last)

    def forward(self, vid: torch.Tensor, txt: torch.Tensor, emb: torch.Tensor, plan: WindowPlan,
                txt_cos: torch.Tensor, txt_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        e = emb_table(emb, self.dim)
        ada_v = self.ada.get("vid")
        vid_n = ada_v.modulate_in(rms_norm(vid, self.eps), e, "attn", ATTN)
        txt_n = rms_norm(txt, self.eps)
        if not self.is_last:
            # Last block: text enters attention NORMALISED BUT UNMODULATED (its ada is vid-only).
            txt_n = self.ada.get("txt").modulate_in(txt_n, e, "attn", ATTN)
        vid_a, txt_a = self.attn(vid_n, txt_n, plan, txt_cos, txt_sin)
        vid = vid + ada_v.modulate_out(self.attn.proj_out.get("vid")(vid_a), e, "attn", ATTN)
        vid = vid + ada_v.modulate_out(
            self.mlp.get("vid")(ada_v.modulate_in(rms_norm(vid, self.eps), e, "mlp", MLP)), e, "mlp", MLP)
        if self.is_last:
            return vid, txt  # the last block's text output is never consumed
        ada_t = self.ada.get("txt")
        txt = txt + ada_t.modulate_out(self.attn.proj_out.get("txt")(txt_a), e, "attn", ATTN)
        txt = txt + ada_t.modulate_out(
            self.mlp.get("txt")(ada_t.modulate_in(rms_norm(txt, self.eps), e, "mlp", MLP)), e, "mlp", MLP)
        return vid, txt


class NaDiT(nn.Module):
    """The SeedVR2 transformer: velocity prediction for a (T, H, W, 33) latent condition."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.vid_in = PatchIn(cfg.patch_features, cfg.vid_dim)
        self.txt_in = nn.Linear(cfg.txt_in_dim, cfg.txt_dim)
        self.emb_in = TimeEmbedding(cfg.sinusoidal_dim, max(cfg.vid_dim, cfg.txt_dim), cfg.emb_dim)
        self.blocks = nn.ModuleList([NaMMSRTransformerBlock(cfg, i) for i in range(cfg.num_layers)])
        self.vid_out_norm = RMSNorm(cfg.vid_dim, cfg.norm_eps)
        self.vid_out_ada = AdaSingle(cfg.vid_dim, layers=("out",), modes=("in",))
        self.vid_out = PatchOut(cfg.vid_dim, cfg.vid_out_channels * cfg.patch_size[1] * cfg.patch_size[2])

    # --- host-side geometry (also used by the ncnn runtime) ---------------------------------
    def grid(self, latent_shape: tuple[int, ...]) -> tuple[int, int, int]:
        _, ph, pw = self.cfg.patch_size
        t, h, w = latent_shape[:3]
        return t, h // ph, w // pw

    def window_plan(self, grid: tuple[int, int, int], shifted: bool, text_len: int,
                    rope: MMRoPE3d) -> WindowPlan:
        wins = partition(grid, shifted, self.cfg.window, self.cfg.window_area, self.cfg.window_max_t)
        device = rope.rope.freqs.device  # the plan lives where the blocks run (tables follow freqs)
        index = [torch.from_numpy(i).to(device) for i in window_token_index(grid, wins)]
        cos, sin = [], []
        for local in window_local_positions(wins):
            c, s = rope.tables(torch.from_numpy(video_positions(local, text_len)))
            cos.append(c)
            sin.append(s)
        return WindowPlan(index, cos, sin)

    # --- stages --------------------------------------------------------------------------------
    def embed_inputs(self, vid: torch.Tensor, txt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.vid_in.proj(patchify(vid)), self.txt_in(txt)

    def output_head(self, vid: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """RMSNorm(weight) -> out modulation from the ATTENTION slot of emb -> Linear.

        The official code reaches this slot through a cache filled by block 0; reading the first
        3D elements of emb instead is the known wrong port.
        """
        e = emb_table(emb, self.cfg.vid_dim)
        return self.vid_out.proj(self.vid_out_ada.modulate_in(self.vid_out_norm(vid), e, "out", ATTN))

    def forward_stages(self, vid: torch.Tensor, txt: torch.Tensor, t: float) -> dict[str, torch.Tensor]:
        """Every intermediate the parity check compares: input tokens, emb, each block, output."""
        grid = self.grid(tuple(vid.shape))
        out: dict[str, torch.Tensor] = {}
        v, x = self.embed_inputs(vid, txt)
        out["vid_tokens"], out["txt_tokens"] = v, x
        emb = self.emb_in(t)
        out["emb"] = emb
        L = txt.shape[0]
        for i, block in enumerate(self.blocks):
            # Plans are rebuilt per block from that block's own freqs buffer (cheap, host-side).
            rope = block.attn.rope
            plan = self.window_plan(grid, block.shifted, L, rope)
            tc, ts = rope.tables(torch.from_numpy(text_positions(L)))
            v, x = block(v, x, emb, plan, tc, ts)
            out[f"block_{i:02d}"] = v
        out["vid_out"] = self.output_head(v, emb)
        out["velocity"] = unpatchify(out["vid_out"], grid, self.cfg.vid_out_channels)
        return out

    def forward(self, vid: torch.Tensor, txt: torch.Tensor, t: float) -> torch.Tensor:
        """(T, H, W, 33), (L, txt_in_dim), t -> velocity (T, H, W, 16)."""
        return self.forward_stages(vid, txt, t)["velocity"]
