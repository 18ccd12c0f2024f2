"""Minimal ncnn inference loops shared by every ported model: sessions, Mat conversion, KV cache,
RoPE tables, masks and sampling. Per-model pipelines live in ``ncnnport.models.<model>``."""
