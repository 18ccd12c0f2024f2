"""Traceable export wrappers over the reference's weights (one graph per ModuleSpec).

Shape-dependent work stays on the host: the window permutation and its inverse, the RoPE tables,
the window mask, the causal mask and the token fusion. Every graph input carries a leading batch
axis of 1 (pnnx treats dim 0 as batch), attention is written as SDPA with an explicit additive
mask, and rotate_half uses slicing so pnnx fuses it into ncnn's RotaryEmbed.

LLM decoder layers use the absorbed MLA form with the compressed latent as the KV cache:
``q_nope @ W_uk`` turns the 128-d no-RoPE query into the 512-d latent space, keys are
``[latent | k_rot]`` shared by all heads (one KV head, SDPA with ``enable_gqa``), values are the
latent itself, and ``W_uv`` is applied after attention. The cache per token is then
``kv_lora + rope`` floats (576 at real size) instead of ``heads*(192+128)`` (10240), and decode
never re-expands past tokens through ``kv_b_proj``. The layer graph reads that cache in place and
returns only the new rows (explicit scores and softmax instead of SDPA: see DecoderLayerGraph).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ncnnport.models.youtu_vl.model import YoutuVL

TOWER = "siglip2.vision_model"


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def deinterleave_rows(n_rope: int) -> torch.Tensor:
    """Row order ``[0,2,4,...,1,3,5,...]``: interleaved-pair RoPE becomes rotate_half RoPE."""
    return torch.cat([torch.arange(0, n_rope, 2), torch.arange(1, n_rope, 2)])


def vision_block(blk: nn.Module, h: torch.Tensor, c: torch.Tensor, s: torch.Tensor, heads: int, head_dim: int,
                 hidden: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """One pre-LN vision block on ``[1,N,D]`` (RoPE tables ``[1,1,N,head_dim]``, optional additive
    window mask), written as SDPA + rotate_half so pnnx fuses RotaryEmbed and SDPA."""
    a = blk.self_attn
    y = blk.layer_norm1(h)
    q = a.q_proj(y).view(1, -1, heads, head_dim).transpose(1, 2)
    k = a.k_proj(y).view(1, -1, heads, head_dim).transpose(1, 2)
    v = a.v_proj(y).view(1, -1, heads, head_dim).transpose(1, 2)
    q = q * c + rotate_half(q) * s
    k = k * c + rotate_half(k) * s
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=a.scale)
    h = h + a.out_proj(o.transpose(1, 2).reshape(1, -1, hidden))
    return h + blk.mlp(blk.layer_norm2(h))


class VisionTowerGraph(nn.Module):
    """Patch embedding + all blocks + post-LN, on patches already in window order.

    Inputs: ``pixel_values [1,N,patch_dim]`` (window order), ``cos``/``sin [1,N,head_dim]``
    (window order), ``window_mask [1,N,N]`` (0 inside a window, -1e30 outside). Full-attention
    blocks ignore the mask. Post-LN is per token, so it commutes with the host's inverse permutation.
    """

    def __init__(self, vl: YoutuVL) -> None:
        super().__init__()
        tower = vl.part(TOWER)
        cfg = vl.cfg.vision
        self.embed = tower.embeddings.patch_embedding
        self.blocks = tower.encoder.layers
        self.post_layernorm = tower.post_layernorm
        self.full = set(cfg.fullatt_block_indexes)
        self.heads, self.head_dim, self.hidden = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size

    def forward(self, pixel_values: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                window_mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(pixel_values)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        mask = window_mask.unsqueeze(1)
        for i, blk in enumerate(self.blocks):
            h = vision_block(blk, h, c, s, self.heads, self.head_dim, self.hidden,
                             None if i in self.full else mask)
        return self.post_layernorm(h)


class VisionSegmentGraph(nn.Module):
    """A run of consecutive vision blocks of one kind, with no mask input at all.

    Window blocks only mix tokens inside a window, and every window block uses the same windows,
    so a run of consecutive window blocks is executed by the host once per window (``n <= 256``
    patches at real size); a full-attention run is executed once over all patches. The first
    segment starts with the patch embedding, the last one ends with post-LN. Inputs:
    ``x [1,n,D]`` (or ``pixel_values [1,n,patch_dim]`` for the first segment), ``cos``/``sin
    [1,n,head_dim]``, all in window order.
    """

    def __init__(self, vl: YoutuVL, start: int, end: int, *, first: bool, last: bool) -> None:
        super().__init__()
        cfg = vl.cfg.vision
        self.embed = vl.part(f"{TOWER}.embeddings.patch_embedding") if first else None
        self.blocks = nn.ModuleList(vl.part(f"{TOWER}.encoder.layers.{i}") for i in range(start, end))
        self.post_layernorm = vl.part(f"{TOWER}.post_layernorm") if last else None
        self.heads, self.head_dim, self.hidden = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        for blk in self.blocks:
            h = vision_block(blk, h, c, s, self.heads, self.head_dim, self.hidden)
        return self.post_layernorm(h) if self.post_layernorm is not None else h


class MergerGraph(nn.Module):
    """``[1,N,D]`` raster-order tower output -> ``[1,N/4,out]`` visual tokens."""

    def __init__(self, vl: YoutuVL) -> None:
        super().__init__()
        self.merger = vl.part("merger")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.merger
        return m.mlp(m.ln_q(x).reshape(1, -1, m.unit_dim))


class TextEmbedGraph(nn.Module):
    """int32 ids ``[1,S]`` -> ``[1,S,H]`` (ncnn Embed)."""

    def __init__(self, vl: YoutuVL) -> None:
        super().__init__()
        self.embed_tokens = vl.part("model.embed_tokens")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)


class DecoderLayerGraph(nn.Module):
    """One MLA decoder layer over the host's latent cache: reads the past, returns the new rows.

    Inputs: ``hidden [1,S,H]``, ``cos``/``sin [1,S,rope]`` (rotate_half layout, positions
    ``past..past+S-1``), ``past_mask [1,S,P]`` (additive, over the cached rows), ``mask [1,S,S]``
    (additive, causal over the new rows), ``past_latent [1,1,P,kv_lora]``, ``past_krot
    [1,1,P,rope]``. Outputs: ``hidden``, the new rows ``latent [1,1,S,kv_lora]`` and ``krot
    [1,1,S,rope]``, which the host writes into its preallocated cache. P >= 1 always: the cache
    starts with one zero row that ``past_mask`` hides (ncnn cannot feed an empty blob).

    Why this form: joining the cache inside the graph (``torch.cat`` -> ncnn Concat) copies the
    whole past every step, and ncnn's SDPA layer repacks K/V on every call, so a step at P=1000
    cost far more than at P=100 (67 % of the bandwidth bound). Here the past is only read: the
    scores over it are two MatMuls (latent and rope parts, never joined), the new rows' scores
    two more, and the softmax is written out over both parts (shared max, one denominator), as
    the Qwen3-ASR decode graph does. The heads and query rows are flattened into the rows of one
    ``[H*S, kv_lora]`` matrix, so every product against the cache is a single matrix product
    that reads the cache once. No slice of the probabilities (pnnx 20261020 drops a slice before
    MatMul; see the Qwen3-ASR decode layer).
    """

    def __init__(self, vl: YoutuVL, index: int) -> None:
        super().__init__()
        t = vl.cfg.text
        layer = vl.part(f"model.layers.{index}")
        a = layer.self_attn
        self.heads, self.nope, self.rope, self.v_dim = t.num_attention_heads, t.qk_nope_head_dim, \
            t.qk_rope_head_dim, t.v_head_dim
        self.kv_lora, self.qk = t.kv_lora_rank, t.qk_head_dim
        self.scale = float(a.scaling)
        self.input_layernorm = layer.input_layernorm
        self.post_attention_layernorm = layer.post_attention_layernorm
        self.q_a_proj, self.q_a_layernorm = a.q_a_proj, a.q_a_layernorm
        self.kv_a_layernorm, self.o_proj, self.mlp = a.kv_a_layernorm, a.o_proj, layer.mlp
        perm = deinterleave_rows(self.rope)
        with torch.no_grad():
            # q_b rows per head: [nope | rope]; de-interleave the rope rows of every head
            head_rows = torch.cat([torch.arange(self.nope), self.nope + perm])
            rows = (torch.arange(self.heads)[:, None] * self.qk + head_rows[None, :]).reshape(-1)
            self.q_b_proj = nn.Linear(a.q_b_proj.in_features, a.q_b_proj.out_features, bias=False)
            self.q_b_proj.weight.copy_(a.q_b_proj.weight[rows])
            src = a.kv_a_proj_with_mqa
            rows = torch.cat([torch.arange(self.kv_lora), self.kv_lora + perm])
            self.kv_a_proj = nn.Linear(src.in_features, src.out_features, bias=src.bias is not None)
            self.kv_a_proj.weight.copy_(src.weight[rows])
            if src.bias is not None:
                self.kv_a_proj.bias.copy_(src.bias[rows])
            w = a.kv_b_proj.weight.view(self.heads, self.nope + self.v_dim, self.kv_lora)
            self.register_buffer("w_uk", w[:, :self.nope, :].contiguous().clone())           # [H,nope,L]
            self.register_buffer("w_uv", w[:, self.nope:, :].transpose(1, 2).contiguous().clone())  # [H,L,v]

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past_mask: torch.Tensor,
                mask: torch.Tensor, past_latent: torch.Tensor, past_krot: torch.Tensor):
        x = self.input_layernorm(hidden)
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(1, -1, self.heads, self.qk).transpose(1, 2)             # [1,H,S,qk]
        q_nope, q_rot = q[..., :self.nope], q[..., self.nope:]
        ckv = self.kv_a_proj(x)                                            # [1,S,L+rope]
        latent = self.kv_a_layernorm(ckv[..., :self.kv_lora]).unsqueeze(1)  # [1,1,S,L]
        k_rot = ckv[..., self.kv_lora:]
        q_rot = q_rot * cos.unsqueeze(1) + rotate_half(q_rot) * sin.unsqueeze(1)
        k_rot = (k_rot * cos + rotate_half(k_rot) * sin).unsqueeze(1)      # [1,1,S,rope]
        q_lat = torch.matmul(q_nope, self.w_uk).reshape(1, 1, -1, self.kv_lora)  # [1,1,H*S,L]
        q_rot = q_rot.reshape(1, 1, -1, self.rope)                         # [1,1,H*S,rope]
        past_scores = self._scores(q_lat, q_rot, past_latent, past_krot, past_mask)  # [1,H,S,P]
        new_scores = self._scores(q_lat, q_rot, latent, k_rot, mask)                 # [1,H,S,S]
        top = torch.maximum(past_scores.amax(-1, keepdim=True), new_scores.amax(-1, keepdim=True))
        past_w = torch.exp(past_scores - top)
        new_w = torch.exp(new_scores - top)
        total = past_w.sum(-1, keepdim=True) + new_w.sum(-1, keepdim=True)  # [1,H,S,1]
        o = torch.matmul(past_w.reshape(1, 1, -1, past_w.shape[-1]), past_latent) + \
            torch.matmul(new_w.reshape(1, 1, -1, new_w.shape[-1]), latent)  # [1,1,H*S,L]
        o = o.reshape(1, self.heads, -1, self.kv_lora) / total             # [1,H,S,L]
        o = torch.matmul(o, self.w_uv)                                     # [1,H,S,v]
        o = o.transpose(1, 2).reshape(1, -1, self.heads * self.v_dim)
        h = hidden + self.o_proj(o)
        h = h + self.mlp(self.post_attention_layernorm(h))
        return h, latent, k_rot

    def _scores(self, q_lat: torch.Tensor, q_rot: torch.Tensor, keys: torch.Tensor, krot: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """Scaled, masked scores ``[1,H,S,T]`` of the flattened queries against ``T`` key rows given
        as their latent ``[1,1,T,L]`` and rope ``[1,1,T,rope]`` parts (never joined: no copy)."""
        s = torch.matmul(q_lat, keys.transpose(-1, -2)) + torch.matmul(q_rot, krot.transpose(-1, -2))
        return s.reshape(1, self.heads, -1, s.shape[-1]) * self.scale + mask.unsqueeze(1)


class LmHeadGraph(nn.Module):
    """Final RMSNorm + tied lm_head on the last row only: ``[1,1,H] -> [1,1,V]``, or, with
    ``rows=(a, b)``, the vocab shard ``[1,1,b-a]`` (its own copy of those rows only)."""

    def __init__(self, vl: YoutuVL, rows: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.norm = vl.part("model.norm")
        if rows is None or tuple(rows) == (0, vl.cfg.text.vocab_size):
            head = vl.part("lm_head")
        else:  # only this shard's rows are read (the whole tied table is never built here)
            a, b = rows
            head = nn.Linear(vl.cfg.text.hidden_size, b - a, bias=False, device="meta")
            # the rows themselves (a view of the reference's table once it is built): no copy, no init
            head.weight = nn.Parameter(vl.head_rows(a, b), requires_grad=False)
        self.lm_head = head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))
