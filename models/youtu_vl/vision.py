"""PyTorch reference of the Youtu-VL vision tower and merger, written from the spec (sections 4-6).

Parameter names follow the official checkpoint (``siglip2.vision_model.*``, ``merger.*``) so a
real checkpoint loads strictly. The reference keeps the official order of operations (permute
hidden states and RoPE angles into window order, attend window by window, undo the permutation
with ``argsort``, then post-LayerNorm) and attends with an explicit per-window loop, so it stays
an independent check of the export path, which uses one additive block-diagonal mask instead.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from ncnnport.models.youtu_vl.config import VisionConfig
from ncnnport.models.youtu_vl.processor import patch_positions, window_layout


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class PatchEmbeddings(nn.Module):
    """Linear patch embedding on ``[N, patch*patch*C]`` rows; no position embedding (spec section 4)."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.patch_embedding = nn.Linear(cfg.patch_dim, cfg.hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.patch_embedding(pixel_values)


class VisionAttention(nn.Module):
    """Multi-head self-attention with 2D RoPE on q/k, restricted to blocks given by ``cu_seqlens``."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.head_dim
        self.scale = self.head_dim ** -0.5
        d = cfg.hidden_size
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cu_seqlens: list[int]) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_heads, self.head_dim)
        c, s = cos[:, None, :].float(), sin[:, None, :].float()
        q = (q.float() * c + rotate_half(q.float()) * s).to(x.dtype)
        k = (k.float() * c + rotate_half(k.float()) * s).to(x.dtype)
        out = torch.empty_like(q)
        for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:]):
            qi, ki, vi = (t[a:b].transpose(0, 1) for t in (q, k, v))  # [H, n_i, hd]
            scores = torch.matmul(qi, ki.transpose(1, 2)) * self.scale
            probs = torch.softmax(scores.float(), dim=-1).to(vi.dtype)
            out[a:b] = torch.matmul(probs, vi).transpose(0, 1)
        return self.out_proj(out.reshape(n, -1))


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class VisionBlock(nn.Module):
    """Pre-LN transformer block (LayerNorm with bias, tanh-GELU MLP)."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.self_attn = VisionAttention(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = VisionMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cu_seqlens: list[int]) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x), cos, sin, cu_seqlens)
        return x + self.mlp(self.layer_norm2(x))


class VisionEncoder(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.num_hidden_layers))


class VisionTransformer(nn.Module):
    """``siglip2.vision_model``: embeddings, encoder, post_layernorm."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = PatchEmbeddings(cfg)
        self.encoder = VisionEncoder(cfg)
        self.post_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def rotary_angles(self, grid_hw: tuple[int, int]) -> torch.Tensor:
        """``[N, head_dim/2]`` angles ``[h*f | w*f]`` per patch, merge-block-major (float32)."""
        dim = self.cfg.head_dim // 2
        inv = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        pos = torch.from_numpy(patch_positions(*grid_hw, self.cfg.spatial_merge_size))
        return (pos[:, :, None].float() * inv[None, None, :]).flatten(1)

    def forward(self, pixel_values: torch.Tensor, grid_hw: tuple[int, int]) -> torch.Tensor:
        """``[N, patch_dim]`` merge-block-major rows -> ``[N, hidden]`` in the same order."""
        cfg = self.cfg
        unit = cfg.merge_unit
        n = pixel_values.shape[0]
        if n != grid_hw[0] * grid_hw[1]:
            raise ValueError(f"{n} patch rows for grid {grid_hw}")
        h = self.embeddings(pixel_values)
        win_index, cu_win = window_layout(*grid_hw, cfg.spatial_merge_size, cfg.window_tokens)
        order = torch.from_numpy(win_index).to(h.device)
        h = h.view(n // unit, unit, -1)[order].reshape(n, -1)
        rpe = self.rotary_angles(grid_hw).to(h.device)
        rpe = rpe.view(n // unit, unit, -1)[order].reshape(n, -1)
        emb = torch.cat((rpe, rpe), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        windows = [int(c) for c in cu_win]
        whole = [0, n]
        for i, block in enumerate(self.encoder.layers):
            h = block(h, cos, sin, whole if i in cfg.fullatt_block_indexes else windows)
        reverse = torch.argsort(order)
        h = h.view(n // unit, unit, -1)[reverse].reshape(n, -1)
        return self.post_layernorm(h)


class Siglip2(nn.Module):
    """Holder so parameter names read ``siglip2.vision_model.*`` as in the checkpoint."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.vision_model = VisionTransformer(cfg)


class PatchMerger(nn.Module):
    """``merger``: RMSNorm, concat each 2x2 block (4 consecutive rows), Linear, exact GELU, Linear."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.unit_dim = cfg.hidden_size * cfg.merge_unit
        self.ln_q = nn.RMSNorm(cfg.hidden_size, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(self.unit_dim, self.unit_dim), nn.GELU(),
                                 nn.Linear(self.unit_dim, cfg.out_hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.unit_dim))
