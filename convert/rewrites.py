"""Named graph rewrites that derive a variant param file from a converted graph (see
``ncnnport.contract.GraphVariant``).

A rewrite may change layer types but never the weights a layer reads from the ``.bin``: a
variant shares its module's weight file, so every rewrite here must keep each layer's
``load_model`` byte layout identical. Each one returns a receipt per changed layer and raises
when it changes nothing, because a variant that silently equals its base graph would be
benchmarked and gated as something it is not.
"""

from __future__ import annotations

from typing import Callable

from ncnnport.package.param_file import ParamError, ParamGraph, ParamLayer

# Gemm params (ncnn): 0 alpha, 1 beta, 2 transA, 3 transB, 4 constantA, 5 constantB, 6 constantC,
# 7 constantM, 8 constantN, 9 constantK, 10 constant_broadcast_type_C, 11 output_N1M,
# 12 output_elempack, 13 output_elemtype, 14 output_transpose. Defaults apply when a key is absent.
_GEMM_DEFAULTS = {"0": "1", "1": "1", "2": "0", "3": "0", "4": "0", "5": "0", "6": "0",
                  "10": "0", "11": "0", "12": "0", "13": "0", "14": "0", "18": "0"}
# A Gemm that is exactly "y = x @ W.T" with a constant W and no C: what InnerProduct computes.
_LINEAR_GEMM = {"2": "0", "3": "1", "4": "0", "5": "1", "11": "0", "12": "0", "13": "0", "14": "0", "18": "0"}


def _gemm_param(layer: ParamLayer, key: str) -> str:
    value = layer.get(key)
    return _GEMM_DEFAULTS.get(key, "0") if value is None else value


def _no_c(layer: ParamLayer) -> bool:
    """True when the Gemm adds nothing: no C input and no constant C read from the .bin."""
    return _gemm_param(layer, "6") == "0" or _gemm_param(layer, "10") == "-1"


def _is_linear_gemm(layer: ParamLayer) -> bool:
    if layer.type != "Gemm" or len(layer.inputs) != 1:
        return False
    if any(_gemm_param(layer, k) != v for k, v in _LINEAR_GEMM.items()):
        return False
    if float(_gemm_param(layer, "0")) != 1.0:
        return False
    n, k = layer.get("8"), layer.get("9")
    return n is not None and k is not None and int(n) > 0 and int(k) > 0 and _no_c(layer)


def gemm_to_innerproduct(graph: ParamGraph, *, module: str) -> list[dict]:
    """Every ``Gemm`` computing ``x @ W.T`` with a constant ``W`` (transB=1) and no bias becomes
    ``InnerProduct`` (num_output=N, no bias, weight_data_size=N*K).

    Same bytes: Gemm loads constant B (transB=1: N rows of K) with ``load(N*K, 0)`` and no C
    when the C broadcast type is -1; InnerProduct loads its weight with the same call and no
    bias. On a 2-D ``[rows, K]`` blob InnerProduct computes each row, like the Gemm. What
    changes: x86 InnerProduct keeps its weights in fp16 under ``use_fp16_storage`` (Gemm does
    not), and it is slower than Gemm on many rows, so this suits decode graphs.

    The param file does not say a blob's rank: on a 3-D blob InnerProduct would flatten it where
    Gemm computes per row. Variants are therefore always checked by local parity against the
    torch wrapper (``parity.local.variant_parity``), which fails such a graph by its numbers.
    """
    changed = []
    for layer in graph.layers:
        if not _is_linear_gemm(layer):
            continue
        n, k = int(layer.get("8")), int(layer.get("9"))
        before = {key: val for key, val in layer.params}
        layer.type = "InnerProduct"
        layer.params = [("0", str(n)), ("1", "0"), ("2", str(n * k))]
        changed.append({"layer": layer.name, "before": {"type": "Gemm", **before},
                        "after": {"type": "InnerProduct", **dict(layer.params)}})
    if not changed:
        raise ParamError(f"module {module}: rewrite gemm_to_innerproduct found no constant-weight Gemm "
                         f"(x @ W.T, no bias) to rewrite")
    return changed


REWRITES: dict[str, Callable[..., list[dict]]] = {"gemm_to_innerproduct": gemm_to_innerproduct}


def apply_rewrites(graph: ParamGraph, names: tuple[str, ...] | list[str], *, module: str) -> list[dict]:
    """Apply the named rewrites in order; one receipt per rewrite (its changed layers)."""
    receipts = []
    for name in names:
        fn = REWRITES.get(name)
        if fn is None:
            raise ParamError(f"module {module}: unknown graph rewrite {name!r}; known: {', '.join(sorted(REWRITES))}")
        receipts.append({"rewrite": name, "changed": fn(graph, module=module)})
    return receipts
