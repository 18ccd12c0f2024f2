"""Traceable export wrappers over a transformers ``Qwen3ASRForConditionalGeneration``.

Each wrapper reuses the HF submodules' weights and rewrites only what pnnx cannot convert:
shape-dependent splitting (done on the host), HF ``repeat_kv`` (replaced by SDPA with
``enable_gqa``), masks and RoPE tables (graph inputs). Every tensor keeps a leading batch of 1.

Split (why): the audio conv runs on fixed 100-frame mel chunks exactly as HF chunks them, so the
graph is static and the host crops the partial last chunk; each audio layer runs once per
attention window (HF's attention is block-diagonal over windows, so per-window calls need no
mask); the text decoder is one prefill graph and one decode graph PER LAYER; final norm +
lm_head project only the last row. One graph per layer keeps export memory bounded by one layer,
lets parity name the first diverging layer, and lets the runtime stream layers in and out of
memory.

Decode never copies the past: the graph reads the host's preallocated cache (past K/V inputs,
views passed to ncnn without a copy) and returns only the new token's K/V rows, which the host
writes in place (``runtime/preallocated_cache.py``). Its hidden state is 2-D ``[1, H]`` so pnnx
emits InnerProduct (ncnn's x86 Gemm has no fp16-weight path; InnerProduct keeps fp16 weights
under ``use_fp16_storage``); so is the head's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Written with halves by slicing (not chunk) so pnnx fuses it into ncnn RotaryEmbed."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class AudioConv(nn.Module):
    """``[1, 1, mel, 2*n_window]`` mel chunk -> ``[1, T, d_model]`` conv features + positions.

    Built from the tower's conv modules and its sinusoid table (``positions``), so the tower's
    encoder layers need not exist in memory."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, conv3: nn.Module, conv_out: nn.Module,
                 positions: torch.Tensor, chunk_frames: int) -> None:
        super().__init__()
        self.conv1, self.conv2, self.conv3 = conv1, conv2, conv3
        self.conv_out = conv_out
        steps = chunk_frames
        for _ in range(3):
            steps = (steps - 1) // 2 + 1
        self.register_buffer("positions", positions[:steps].clone()[None])

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.conv1(mel))
        h = F.gelu(self.conv2(h))
        h = F.gelu(self.conv3(h))
        _, c, f, t = h.shape
        h = h.permute(0, 3, 1, 2).reshape(1, t, c * f)
        return self.conv_out(h) + self.positions


class AudioLayer(nn.Module):
    """One audio encoder layer over one attention window: ``[1,L,d] -> [1,L,d]``.

    HF's attention is block-diagonal over windows, so calling the layer per window needs no mask.
    """

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer
        attn = layer.self_attn
        self.heads, self.head_dim, self.scale = attn.num_heads, attn.head_dim, attn.scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer, attn = self.layer, self.layer.self_attn

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(1, -1, self.heads, self.head_dim).transpose(1, 2)
        h = layer.self_attn_layer_norm(x)
        o = F.scaled_dot_product_attention(heads(attn.q_proj(h)), heads(attn.k_proj(h)), heads(attn.v_proj(h)),
                                           scale=self.scale)
        x = x + attn.out_proj(o.transpose(1, 2).reshape(1, -1, self.heads * self.head_dim))
        return x + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(x))))


class AudioHead(nn.Module):
    """``ln_post`` + the multimodal projector: ``[1,L,d] -> [1,L,out]`` (per token)."""

    def __init__(self, ln_post: nn.Module, projector: nn.Module) -> None:
        super().__init__()
        self.ln_post = ln_post
        self.projector = projector

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector(self.ln_post(x))


class TokenEmbed(nn.Module):
    """int32 ids ``[1,S]`` -> ``[1,S,H]`` (ncnn Embed; ids must be int32 on the ncnn side)."""

    def __init__(self, embed: nn.Embedding) -> None:
        super().__init__()
        self.embed = embed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids)


class _DecoderStack(nn.Module):
    """Shared layer math (Qwen3: per-head q/k RMSNorm, GQA, RoPE, SwiGLU) over decoder layers.

    Holds only the layers it is given: a per-layer graph carries one layer's weights (a wrapper
    holding the whole ``ModuleList`` would serialise every layer into every TorchScript file)."""

    def __init__(self, layers: list[nn.Module], config) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        attn = layers[0].self_attn
        self.n_heads, self.n_kv = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.scale = attn.head_dim, attn.scaling

    def layer(self, i: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor):
        layer = self.layers[i]
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.q_norm(attn.q_proj(x).view(1, -1, self.n_heads, self.head_dim)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(x).view(1, -1, self.n_kv, self.head_dim)).transpose(1, 2)
        v = attn.v_proj(x).view(1, -1, self.n_kv, self.head_dim).transpose(1, 2)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1), scale=self.scale,
                                           enable_gqa=True)
        h = h + attn.o_proj(o.transpose(1, 2).reshape(1, -1, self.n_heads * self.head_dim))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h, k, v


class TextPrefillLayer(_DecoderStack):
    """One decoder layer over the prompt: ``(h [1,S,H], cos/sin [1,S,hd], mask [1,S,S])`` ->
    ``(h, k, v)`` with K/V ``[1,kv_heads,S,hd]`` for the cache."""

    def __init__(self, layer: nn.Module, config) -> None:
        super().__init__([layer], config)

    def forward(self, h, cos, sin, mask):
        return self.layer(0, h, cos, sin, mask)


class TextDecodeLayer(_DecoderStack):
    """One decoder layer for one token over the host's cache: ``(h [1,H], cos/sin [1,1,hd],
    past_k/past_v [1,kv,P,hd])`` -> ``(h [1,H], k/v [1,kv,1,hd])``, the new token's rows only.

    The past is read, never concatenated (no ncnn Concat copying the cache each step). The
    ``g = heads/kv`` query heads that share a kv head are the rows of one ``[g, hd]`` query
    (``q.view(kv, g, hd)``; HF maps kv head j to heads ``j*g .. j*g+g-1``), so K/V are read once
    per kv head and never repeated. Attention over past + new token without joining K/V: scores
    over the past by MatMul, the new token's score elementwise, and the softmax written out
    (shared max, exp, one denominator). Concatenating the scores and slicing the probabilities
    back (``a[..., :-1]``) is the obvious form, but pnnx 20261020 drops that slice before the
    MatMul (wrong numbers, no error); this form has no slice. No mask: decode sees every past
    position.
    """

    def __init__(self, layer: nn.Module, config) -> None:
        super().__init__([layer], config)
        self.groups = self.n_heads // self.n_kv

    def forward(self, h, cos, sin, past_k, past_v):
        layer = self.layers[0]
        attn = layer.self_attn
        hd = self.head_dim
        x = layer.input_layernorm(h)
        q = attn.q_norm(attn.q_proj(x).view(1, self.n_heads, 1, hd))
        k = attn.k_norm(attn.k_proj(x).view(1, self.n_kv, 1, hd))
        v = attn.v_proj(x).view(1, self.n_kv, 1, hd)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        q = q.view(1, self.n_kv, self.groups, hd)
        past_scores = torch.matmul(q, past_k.transpose(-1, -2)) * self.scale   # [1,kv,g,P]
        new_score = (q * k).sum(-1, keepdim=True) * self.scale                 # [1,kv,g,1]
        top = torch.maximum(past_scores.amax(-1, keepdim=True), new_score)
        past_w = torch.exp(past_scores - top)
        new_w = torch.exp(new_score - top)
        o = (torch.matmul(past_w, past_v) + new_w * v) / (past_w.sum(-1, keepdim=True) + new_w)
        h = h + attn.o_proj(o.reshape(1, self.n_heads * hd))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h, k, v


class StaticReshapeDecode(_DecoderStack):
    """The public ports' decode graph: HF-style ``repeat_kv`` (expand + reshape) traced at ONE
    cache length. pnnx bakes ``past+1`` into a Reshape; only the ``Reshape -> -1`` param patch
    lets it run at other lengths. Kept to prove the patch machinery on a real failure."""

    def forward(self, emb, cos, sin, mask, *past):
        h = emb
        outs = []
        groups = self.n_heads // self.n_kv
        for i in range(len(self.layers)):
            layer = self.layers[i]
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_norm(attn.q_proj(x).view(1, -1, self.n_heads, self.head_dim)).transpose(1, 2)
            k = attn.k_norm(attn.k_proj(x).view(1, -1, self.n_kv, self.head_dim)).transpose(1, 2)
            v = attn.v_proj(x).view(1, -1, self.n_kv, self.head_dim).transpose(1, 2)
            c, s = cos.unsqueeze(1), sin.unsqueeze(1)
            q = q * c + rotate_half(q) * s
            k = k * c + rotate_half(k) * s
            k = torch.cat((past[2 * i], k), dim=2)
            v = torch.cat((past[2 * i + 1], v), dim=2)
            outs += [k, v]
            t = k.shape[2]
            kr = k[:, :, None].expand(1, self.n_kv, groups, t, self.head_dim).reshape(1, self.n_heads, t, self.head_dim)
            vr = v[:, :, None].expand(1, self.n_kv, groups, t, self.head_dim).reshape(1, self.n_heads, t, self.head_dim)
            o = F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask.unsqueeze(1), scale=self.scale)
            h = h + attn.o_proj(o.transpose(1, 2).reshape(1, -1, self.n_heads * self.head_dim))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return (h, *outs)


class LmHead(nn.Module):
    """Final RMSNorm + head on the last hidden row only: ``[1,H]`` -> ``[1,V]`` (2-D: pnnx emits
    InnerProduct, which keeps fp16 weights; the 151936 x 1024 table dominates a token)."""

    def __init__(self, norm: nn.Module, lm_head: nn.Linear) -> None:
        super().__init__()
        self.norm = norm
        self.lm_head = lm_head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))
