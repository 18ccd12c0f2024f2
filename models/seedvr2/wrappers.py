"""Traceable export wrappers over the reference's weights (one ``nn.Module`` per ncnn graph).

Rules that shape these wrappers (see the pnnx/ncnn field notes):
* every tensor carries a leading batch axis of 1 and has rank <= 5 (ncnn Mats are <= 4-D);
* nothing shape-dependent is computed in the graph: window partition, window-local RoPE tables
  and the timestep sinusoid are host-side inputs;
* MMRoPE's adjacent-pair rotation is turned into rotate-half by permuting Q/K channels offline
  (rows of ``proj_qkv`` and the QK-norm weights to ``[0, 2, 4, ..., 1, 3, 5, ...]``); the
  attention logits are invariant to a common permutation of Q and K channels, V is untouched;
* per-frame GroupNorm is written as reshape + mean/var (stock Reduction/BinaryOp, dynamic in
  T/H/W); the VAE's depth-to-space (+ frame drop) runs on the host between decoder graphs.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ncnnport.models.seedvr2.dit import NaDiT, NaMMSRTransformerBlock
from ncnnport.models.seedvr2.conv_fold import fold_convs
from ncnnport.models.seedvr2.host_numpy import depth_to_space, pair_to_half_perm  # noqa: F401 (re-exported)
from ncnnport.models.seedvr2.vae import FrameAttention, MidBlock3D, ResnetBlock3D, VideoAutoencoderKL


# --- shared pieces ---------------------------------------------------------------------------
def rms(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm as ``F.rms_norm`` (pnnx fuses it into ncnn RMSNorm).

    This matters beyond speed: a fused RMSNorm pins pnnx's batch axis to 0 for the connected
    graph. Without one, pnnx solved the batch axis of a Linear's input as "none" (233), wrapped
    the Gemm in Reshapes that produce a 3-D Mat, and ncnn broadcast that against the 2-D
    residual along the wrong axes ((N, D) + (1, N, D) came back as (N, D, D)).
    """
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def swap_halves(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [x2, x1]``. With the sign of rotate-half folded into a host-side table
    (``sin_signed = [-sin, sin]``), ``x*cos + swap_halves(x)*sin_signed`` equals rotate-half RoPE
    bit for bit. Written this way pnnx does NOT fuse it into ncnn's RotaryEmbed, whose table
    layout differs from these full-width tables (the fused graph returned garbage, 1e37)."""
    half = x.shape[-1] // 2
    return torch.cat([x[..., half:], x[..., :half]], dim=-1)


# --- DiT -------------------------------------------------------------------------------------
class DiTInput(nn.Module):
    """Patched video tokens (1, N, 132) and text (1, L, txt_in) -> (1, N, D), (1, L, D)."""

    def __init__(self, dit: NaDiT) -> None:
        super().__init__()
        self.vid = dit.vid_in.proj
        self.txt = dit.txt_in

    def forward(self, vid: torch.Tensor, txt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.vid(vid), self.txt(txt)


class DiTEmbedding(nn.Module):
    """Timestep sinusoid (1, 256) -> modulation table (1, 6, D), row l*3+g (de-interleaved here
    once, so block graphs take plain rows)."""

    def __init__(self, dit: NaDiT) -> None:
        super().__init__()
        self.emb = dit.emb_in
        self.dim = dit.cfg.vid_dim

    def forward(self, sinus: torch.Tensor) -> torch.Tensor:
        return self.emb.mlp(sinus).reshape(1, self.dim, 6).permute(0, 2, 1)


def _permuted_qkv(block: NaMMSRTransformerBlock, branch: str, perm: np.ndarray) -> tuple[nn.Linear, torch.Tensor, torch.Tensor]:
    """Copy of the QKV Linear with Q and K rows permuted per head, and permuted QK-norm weights."""
    a = block.attn
    lin = a.proj_qkv.get(branch)
    H, hd = a.heads, a.head_dim
    rows = np.arange(3 * H * hd).reshape(3, H, hd)
    rows[0] = rows[0][:, perm]
    rows[1] = rows[1][:, perm]
    idx = torch.from_numpy(rows.reshape(-1).copy())
    # built on meta and given the permuted rows: no throwaway allocation + init of a
    # 7680 x 2560 weight at real width (the gather is the only copy)
    new = nn.Linear(lin.in_features, lin.out_features, bias=lin.bias is not None, device="meta")
    with torch.no_grad():
        new.weight = _frozen(lin.weight[idx])
        if lin.bias is not None:
            new.bias = _frozen(lin.bias[idx])
    p = torch.from_numpy(perm.copy())
    return new, a.norm_q.get(branch).weight.detach()[p].clone(), a.norm_k.get(branch).weight.detach()[p].clone()


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach(), requires_grad=False)


def _copy(t: torch.Tensor) -> nn.Parameter:
    """A wrapper's own copy of a (small) modulation vector."""
    return nn.Parameter(t.detach().clone(), requires_grad=False)


class _QKV(nn.Module):
    def __init__(self, block: NaMMSRTransformerBlock, branch: str, perm: np.ndarray) -> None:
        super().__init__()
        self.heads, self.head_dim, self.eps = block.attn.heads, block.attn.head_dim, block.attn.eps
        self.proj, wq, wk = _permuted_qkv(block, branch, perm)
        self.wq = nn.Parameter(wq, requires_grad=False)
        self.wk = nn.Parameter(wk, requires_grad=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x (1, L, D), cos/sin_signed (1, L, hd) rotate-half layout -> q, k, v (1, L, H, hd)."""
        qkv = self.proj(x).reshape(1, -1, 3 * self.heads, self.head_dim)
        q = qkv[:, :, : self.heads]
        k = qkv[:, :, self.heads: 2 * self.heads]
        v = qkv[:, :, 2 * self.heads:]
        q = rms(q, self.eps, self.wq)
        k = rms(k, self.eps, self.wk)
        c, s = cos.unsqueeze(2), sin.unsqueeze(2)
        return q * c + swap_halves(q) * s, k * c + swap_halves(k) * s, v


class DiTBlockPre(nn.Module):
    """Norm + attention-in modulation + QKV + QK-norm + RoPE for both streams of one block.

    Inputs: vid (1,N,D), txt (1,L,D), emb6 (1,6,D), cos_v/sin_v (1,N,hd) in raster order (each
    token's window-local position), cos_t/sin_t (1,L,hd); sin tables carry rotate-half's sign
    (first half negated). Outputs q/k/v for video and text
    (1, *, H, hd). The last block's text is normalised but not modulated.

    Shared-weight blocks (one ``.all`` QKV for both streams) run the two streams as ONE token
    sequence through one QKV Linear and split it after: written per stream, pnnx emits two Gemm
    layers that each store the same 7680 x 2560 weight (the real package was 19.8 GB instead of
    13.6 GB, 6.3 GB of it duplicated ``.all`` weights of blocks 10-31).
    """

    def __init__(self, block: NaMMSRTransformerBlock) -> None:
        super().__init__()
        perm = pair_to_half_perm(block.attn.head_dim)
        self.is_last, self.eps = block.is_last, block.eps
        self.shared = block.attn.proj_qkv.shared
        ada_v = block.ada.get("vid")
        self.v_shift, self.v_scale = _copy(ada_v.attn_shift), _copy(ada_v.attn_scale)
        if not self.is_last and not self.shared:
            ada_t = block.ada.get("txt")
            self.t_shift, self.t_scale = _copy(ada_t.attn_shift), _copy(ada_t.attn_scale)
        self.qkv_v = _QKV(block, "vid", perm)
        if not self.shared:
            self.qkv_t = _QKV(block, "txt", perm)

    def forward(self, vid, txt, emb6, cos_v, sin_v, cos_t, sin_t):
        shift, scale = emb6[:, 0:1], emb6[:, 1:2]
        n = vid.shape[1]
        if self.shared and not self.is_last:   # same norm, modulation and QKV for every token
            x = rms(torch.cat([vid, txt], dim=1), self.eps) * (scale + self.v_scale) + (shift + self.v_shift)
            return self._split(self.qkv_v(x, torch.cat([cos_v, cos_t], dim=1), torch.cat([sin_v, sin_t], dim=1)), n)
        vn = rms(vid, self.eps) * (scale + self.v_scale) + (shift + self.v_shift)
        tn = rms(txt, self.eps)
        if not self.is_last:
            tn = tn * (scale + self.t_scale) + (shift + self.t_shift)
        if not self.shared:
            return (*self.qkv_v(vn, cos_v, sin_v), *self.qkv_t(tn, cos_t, sin_t))
        # shared last block: modulated video and unmodulated text through the one QKV
        return self._split(self.qkv_v(torch.cat([vn, tn], dim=1), torch.cat([cos_v, cos_t], dim=1),
                                      torch.cat([sin_v, sin_t], dim=1)), n)

    @staticmethod
    def _split(qkv: tuple[torch.Tensor, ...], n: int) -> tuple[torch.Tensor, ...]:
        """(q, k, v) over [video; text] -> q_v, k_v, v_v, q_t, k_t, v_t."""
        return (*(t[:, :n] for t in qkv), *(t[:, n:] for t in qkv))


class DiTAttention(nn.Module):
    """Weightless full attention over one window's sequence [window video, all text]:
    q/k/v (1, S, H, hd) -> (1, S, H, hd). One graph serves every block and window."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        o = F.scaled_dot_product_attention(q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3),
                                           v.permute(0, 2, 1, 3), scale=self.scale)
        return o.permute(0, 2, 1, 3)


class _PostModulation(nn.Module):
    """The post graph's own copies of one stream's attention gate and MLP modulation vectors
    (the block's attention shift/scale belong to the pre graph and are not held here)."""

    def __init__(self, ada: nn.Module) -> None:
        super().__init__()
        self.attn_gate, self.mlp_shift = _copy(ada.attn_gate), _copy(ada.mlp_shift)
        self.mlp_scale, self.mlp_gate = _copy(ada.mlp_scale), _copy(ada.mlp_gate)


class DiTBlockPost(nn.Module):
    """proj_out + gate + residual, then norm + MLP modulation + SwiGLU + gate + residual.

    Attention outputs come flattened to (1, *, H*hd) (a free host reshape). The last block has
    no text output (its text result is never consumed), so its graph takes only the video.
    Shared-weight blocks run both streams as one token sequence (every op here is per token and
    the weights are the same), so the graph stores the ``.all`` weights once (see DiTBlockPre)."""

    def __init__(self, block: NaMMSRTransformerBlock) -> None:
        super().__init__()
        self.is_last, self.eps = block.is_last, block.eps
        self.shared = block.mlp.shared
        self.proj_v = block.attn.proj_out.get("vid")
        self.mlp_v = block.mlp.get("vid")
        self.ada_v = _PostModulation(block.ada.get("vid"))
        if not self.is_last and not self.shared:
            self.proj_t = block.attn.proj_out.get("txt")
            self.mlp_t = block.mlp.get("txt")
            self.ada_t = _PostModulation(block.ada.get("txt"))

    def _stream(self, x, attn, emb6, proj, mlp, ada):
        x = x + proj(attn) * (emb6[:, 2:3] + ada.attn_gate)
        h = rms(x, self.eps) * (emb6[:, 4:5] + ada.mlp_scale) + (emb6[:, 3:4] + ada.mlp_shift)
        return x + mlp(h) * (emb6[:, 5:6] + ada.mlp_gate)

    def forward(self, *args):
        if self.is_last:
            vid, emb6, attn_v = args
            return self._stream(vid, attn_v, emb6, self.proj_v, self.mlp_v, self.ada_v)
        vid, txt, emb6, attn_v, attn_t = args
        if self.shared:
            n = vid.shape[1]
            y = self._stream(torch.cat([vid, txt], dim=1), torch.cat([attn_v, attn_t], dim=1), emb6,
                             self.proj_v, self.mlp_v, self.ada_v)
            return y[:, :n], y[:, n:]
        return (self._stream(vid, attn_v, emb6, self.proj_v, self.mlp_v, self.ada_v),
                self._stream(txt, attn_t, emb6, self.proj_t, self.mlp_t, self.ada_t))


class DiTOutput(nn.Module):
    """RMSNorm(weight) -> modulation from the ATTENTION rows (0 shift, 1 scale) -> Linear."""

    def __init__(self, dit: NaDiT) -> None:
        super().__init__()
        self.norm, self.ada, self.proj = dit.vid_out_norm, dit.vid_out_ada, dit.vid_out.proj

    def forward(self, vid: torch.Tensor, emb6: torch.Tensor) -> torch.Tensor:
        x = rms(vid, self.norm.eps, self.norm.weight)
        x = x * (emb6[:, 1:2] + self.ada.out_scale) + (emb6[:, 0:1] + self.ada.out_shift)
        return self.proj(x)


# --- VAE -------------------------------------------------------------------------------------
def gn_frames(norm: nn.GroupNorm, x: torch.Tensor) -> torch.Tensor:
    """Per-frame GroupNorm on (1, C, T, H, W) without moving frames into the batch axis."""
    t, h, w = x.shape[2], x.shape[3], x.shape[4]
    y = x.permute(0, 2, 1, 3, 4).reshape(1, t, norm.num_groups, -1)
    mean = y.mean(-1, keepdim=True)
    d = y - mean
    var = (d * d).mean(-1, keepdim=True)
    y = (d / torch.sqrt(var + norm.eps)).reshape(1, t, x.shape[1], h, w).permute(0, 2, 1, 3, 4)
    return y * norm.weight.reshape(1, -1, 1, 1, 1) + norm.bias.reshape(1, -1, 1, 1, 1)


def resnet(r: ResnetBlock3D, x: torch.Tensor) -> torch.Tensor:
    h = r.conv1(F.silu(gn_frames(r.norm1, x)))
    h = r.conv2(F.silu(gn_frames(r.norm2, h)))
    return (r.conv_shortcut(x) if r.conv_shortcut is not None else x) + h


def frame_attention(a: FrameAttention, x: torch.Tensor) -> torch.Tensor:
    c = a.to_q.in_features  # a Python int (x.shape[1] would be traced into the scale)
    t, h, w = x.shape[2], x.shape[3], x.shape[4]
    y = gn_frames(a.group_norm, x).permute(0, 2, 3, 4, 1).reshape(1, t, -1, c)   # (1, T, HW, C)
    o = F.scaled_dot_product_attention(a.to_q(y), a.to_k(y), a.to_v(y), scale=1.0 / math.sqrt(c))
    return x + a.to_out[0](o).reshape(1, t, h, w, c).permute(0, 4, 1, 2, 3)


def mid_block(m: MidBlock3D, x: torch.Tensor) -> torch.Tensor:
    return resnet(m.resnets[1], frame_attention(m.attentions[0], resnet(m.resnets[0], x)))


class VAEEncode(nn.Module):
    """(1, 3, T, H, W) in [-1, 1] -> posterior mean, clamped logvar (1, 16, t, h, w)."""

    def __init__(self, vae: VideoAutoencoderKL, fold: bool = True, single_frame: bool = False) -> None:
        super().__init__()
        # 3-D convs as 2-D convs (ncnn Convolution, not its unoptimised x86 Convolution3D): a
        # structural copy over the same Parameters, so the reference model keeps its Conv3d.
        # single_frame: the image twin (runner.image_graph), temporal taps summed
        self.enc = fold_convs(vae.encoder, inplace=False, single_frame=single_frame) if fold else vae.encoder
        self.cfg = vae.cfg

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        e = self.enc
        x = e.conv_in(x)
        for blk in e.down_blocks:
            for r in blk.resnets:
                x = resnet(r, x)
            if blk.downsamplers is not None:
                x = blk.downsamplers[0](x)
        x = mid_block(e.mid_block, x)
        m = e.conv_out(F.silu(gn_frames(e.conv_norm_out, x)))
        c = self.cfg.latent_channels
        return m[:, :c], torch.clamp(m[:, c:], self.cfg.logvar_min, self.cfg.logvar_max)


class VAEDecodeStage(nn.Module):
    """One decoder segment between two depth-to-space steps (which run on the host).

    Stage 0: conv_in, mid block, up-block 0, up-block 0's 1x1x1 upscale conv. Stage k: the causal
    conv that follows upsample k-1, up-block k, its upscale conv (if any). The last stage ends
    with GroupNorm, SiLU, conv_out. Holds only its own submodules, so each exported segment
    carries only its own weights.
    """

    def __init__(self, vae: VideoAutoencoderKL, stage: int, fold: bool = True, single_frame: bool = False) -> None:
        super().__init__()
        d = vae.decoder
        self.stage = stage
        self.last = stage == len(d.up_blocks) - 1
        if stage == 0:
            self.conv_in, self.mid = d.conv_in, d.mid_block
        else:
            self.conv_in = d.up_blocks[stage - 1].upsamplers[0].conv
        self.resnets = d.up_blocks[stage].resnets
        if self.last:
            self.norm_out, self.conv_out = d.conv_norm_out, d.conv_out
        else:
            self.upscale = d.up_blocks[stage].upsamplers[0].upscale_conv
        if fold:  # as in VAEEncode: 2-D convs over the same Parameters
            for name, child in list(self.named_children()):
                setattr(self, name, fold_convs(child, inplace=False, single_frame=single_frame))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        if self.stage == 0:
            x = mid_block(self.mid, x)
        for r in self.resnets:
            x = resnet(r, x)
        if self.last:
            return self.conv_out(F.silu(gn_frames(self.norm_out, x)))
        return self.upscale(x)
