"""The tied token embedding as a host-side row lookup into the lm_head weights.

Youtu-LLM ties ``embed_tokens`` and ``lm_head`` (``tie_word_embeddings``). Exported as two graphs
the ``[V,H]`` table is stored twice (an ncnn Embed in ``text_embed`` and the constant B of the
``lm_head`` Gemm): 2 x 128266 x 80 x 4 B = 82 MB of the tiny package, 2 x 1.3 GB at real scale.
An embedding is a row gather, no arithmetic, so the host reads the rows straight out of
``lm_head.ncnn.bin`` (memory-mapped: only the rows used are paged in) and the package holds
the table once. On the torch side the same lookup reads the wrapper's ``lm_head.weight``.

Layout read here (checked strictly, the file is named on any mismatch): the lm_head graph is
``Input -> RMSNorm(affine) -> Gemm(constant B, transB, N=V, K=H)``; its .bin holds the RMSNorm
gamma (H raw float32, load type 1), then B with a 4-byte storage tag (0: float32,
0x01306B47: float16, as written by pnnx fp16 weights) and ``V*H`` values, padded to 4 bytes.
"""

from __future__ import annotations

from collections import ChainMap
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ncnnport.contract import TensorSpec

EMBED_NAME = "text_embed"
LM_HEAD_NAME = "lm_head"
TAG_FP32 = 0
TAG_FP16 = 0x01306B47


class TiedEmbeddingError(ValueError):
    """The lm_head graph does not have the layout the host-side lookup reads."""


def _int(layer: Any, key: str, path: Path) -> int:
    v = layer.get(key)
    if v is None:
        raise TiedEmbeddingError(f"{path}: layer {layer.name} has no param {key}=")
    return int(v)


def read_head_table(param: Path, weights: Path) -> np.ndarray:
    """``[V,H]`` table of the lm_head Gemm, memory-mapped from ``weights`` (float32 or float16)."""
    from ncnnport.package.param_file import read_param

    graph = read_param(param)
    types = graph.layer_types()
    # the head graph, or its ``decode`` variant (InnerProduct over the same .bin bytes)
    if types not in (["Input", "RMSNorm", "Gemm"], ["Input", "RMSNorm", "InnerProduct"]):
        raise TiedEmbeddingError(f"{param}: expected Input, RMSNorm, Gemm (or InnerProduct) for the tied "
                                 f"lm_head, got {types}")
    norm, gemm = graph.layers[1], graph.layers[2]
    hidden = _int(norm, "0", param)
    if _int(norm, "2", param) != 1:
        raise TiedEmbeddingError(f"{param}: RMSNorm without affine weights")
    if gemm.type == "InnerProduct":
        if _int(gemm, "1", param) != 0:
            raise TiedEmbeddingError(f"{param}: InnerProduct with a bias is not a tied head")
        vocab, size = _int(gemm, "0", param), _int(gemm, "2", param)
        if vocab <= 0 or size % vocab:
            raise TiedEmbeddingError(f"{param}: InnerProduct weight_data_size {size} is not num_output {vocab} x K")
        k = size // vocab
    elif _int(gemm, "5", param) != 1 or _int(gemm, "3", param) != 1:
        raise TiedEmbeddingError(f"{param}: Gemm B is not a constant [N,K] weight (5=1 3=1)")
    else:
        vocab, k = _int(gemm, "8", param), _int(gemm, "9", param)
    if k != hidden:
        raise TiedEmbeddingError(f"{param}: Gemm K={k} but RMSNorm width {hidden}")
    offset = hidden * 4
    size = Path(weights).stat().st_size
    if size < offset + 4:
        raise TiedEmbeddingError(f"{weights}: {size} bytes, too short for the lm_head weights")
    tag = int(np.fromfile(weights, dtype="<u4", count=1, offset=offset)[0])
    dtype = {TAG_FP32: np.dtype("<f4"), TAG_FP16: np.dtype("<f2")}.get(tag)
    if dtype is None:
        raise TiedEmbeddingError(f"{weights}: lm_head weight storage tag {tag:#x} is not float32/float16")
    n_bytes = vocab * hidden * dtype.itemsize
    padded = (n_bytes + 3) // 4 * 4
    if size != offset + 4 + padded:
        raise TiedEmbeddingError(f"{weights}: {size} bytes, expected {offset + 4 + padded} for a "
                                 f"{vocab}x{hidden} {dtype} lm_head")
    return np.memmap(weights, dtype=dtype, mode="r", offset=offset + 4, shape=(vocab, hidden))


def _head_table(head: Any) -> tuple[Any, str]:
    if hasattr(head, "param") and hasattr(head, "weights"):
        return read_head_table(head.param, head.weights), str(head.weights)
    module = getattr(head, "module", None)
    weight = getattr(getattr(module, "lm_head", None), "weight", None)
    if weight is None:
        raise TypeError(f"cannot read a tied embedding from lm_head runner {type(head).__name__}")
    return weight.detach().float().numpy(), "torch lm_head.weight"


class RowShards:
    """Row-sharded ``[V,H]`` table (the split head's memmaps) behind ``shape`` and row gathering."""

    def __init__(self, tables: Sequence[Any]) -> None:
        widths = {int(t.shape[1]) for t in tables}
        if len(widths) != 1:
            raise TiedEmbeddingError(f"head shards have different widths {sorted(widths)}")
        self.tables = list(tables)
        self.starts = np.cumsum([0] + [int(t.shape[0]) for t in tables])
        self.shape = (int(self.starts[-1]), widths.pop())

    def __getitem__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        out = np.empty((ids.size, self.shape[1]), np.float32)
        which = np.searchsorted(self.starts, ids, side="right") - 1
        for k in np.unique(which):
            sel = which == k
            out[sel] = self.tables[k][ids[sel] - self.starts[k]]
        return out


def head_names(runners: Mapping[str, Any]) -> list[str]:
    """``["lm_head"]`` or the shards ``lm_head_part{k}`` in vocab order (found without opening)."""
    if LM_HEAD_NAME in runners:
        return [LM_HEAD_NAME]
    prefix = LM_HEAD_NAME + "_part"
    parts = sorted((n for n in runners if n.startswith(prefix) and n[len(prefix):].isdigit()),
                   key=lambda n: int(n[len(prefix):]))
    if not parts:
        raise KeyError(f"no {LM_HEAD_NAME} graph (or {prefix}K shards) to read a tied embedding from")
    return parts


class TiedEmbedding:
    """Runner-shaped (``name``/``inputs``/``outputs``/``run``) host lookup ``ids [1,S] -> [1,S,H]``."""

    def __init__(self, table: np.ndarray, source: str) -> None:
        self.table, self.source = table, source
        vocab, hidden = table.shape
        self.name = EMBED_NAME
        self.inputs = [TensorSpec("ids", (1, "seq"), "int32")]
        self.outputs = [TensorSpec("embeds", (1, "seq", hidden))]

    @classmethod
    def from_head(cls, head: Any) -> "TiedEmbedding":
        """From an lm_head runner: an ``NcnnModule`` (its .bin) or a ``TorchModule`` (its weight)."""
        return cls(*_head_table(head))

    @classmethod
    def from_heads(cls, heads: Sequence[Any]) -> "TiedEmbedding":
        """From the vocab shards of a split head, in vocab order."""
        if len(heads) == 1:
            return cls.from_head(heads[0])
        tables = [_head_table(h) for h in heads]
        return cls(RowShards([t for t, _ in tables]), f"{len(tables)} head shards ({tables[0][1]}, ...)")

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        (ids,) = arrays
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[0] != 1 or ids.dtype != np.int32:
            raise ValueError(f"{self.name}: ids must be int32 [1,S], got {ids.dtype} {ids.shape}")
        vocab = self.table.shape[0]
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise ValueError(f"{self.name}: token id out of range [0, {vocab}): {ids.min()}..{ids.max()}")
        return [np.asarray(self.table[ids[0]], dtype=np.float32)[None]]


def with_tied_embedding(runners: Mapping[str, Any]) -> Mapping[str, Any]:
    """``runners`` plus a host ``text_embed`` read from its lm_head when no graph provides one."""
    if EMBED_NAME in runners:
        return runners
    # an overlay, not a copy: a lazy mapping keeps opening graphs only when they are looked up
    heads = [runners[n] for n in head_names(runners)]
    return ChainMap({EMBED_NAME: TiedEmbedding.from_heads(heads)}, runners)
