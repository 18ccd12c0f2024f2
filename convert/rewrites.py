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

from ncnnport.package.param_file import WEIGHTLESS_TYPES, ParamError, ParamGraph, ParamLayer

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


def _producers(graph: ParamGraph) -> dict[str, ParamLayer]:
    return {b: layer for layer in graph.layers for b in layer.outputs}


def _consumers(graph: ParamGraph) -> dict[str, list[ParamLayer]]:
    out: dict[str, list[ParamLayer]] = {}
    for layer in graph.layers:
        for b in layer.inputs:
            out.setdefault(b, []).append(layer)
    return out


def _through_splits(blob: str, producers: dict[str, ParamLayer]) -> str:
    """The blob a chain of ``Split`` layers fans out (``blob`` itself when no Split made it)."""
    while blob in producers and producers[blob].type == "Split":
        blob = producers[blob].inputs[0]
    return blob


def _reaches(start: str, target: ParamLayer, consumers: dict[str, list[ParamLayer]], inside: set[int]) -> bool:
    """Whether ``target`` is downstream of blob ``start`` through layers of ``inside`` (ids)."""
    todo, seen = [start], set()
    while todo:
        for layer in consumers.get(todo.pop(), []):
            if id(layer) not in inside or id(layer) in seen:
                continue
            if layer is target:
                return True
            seen.add(id(layer))
            todo += layer.outputs
    return False


def decode_attention_to_sdpa(graph: ParamGraph, *, module: str) -> list[dict]:
    """A decode step's attention written as explicit scores over a past K/V (two ``MatMul`` reading
    graph inputs, the current row's score and value beside them, a max-subtracted softmax) becomes
    ``Concat`` (past + current row) + ncnn's ``SDPA``; no weights change.

    Why: ncnn 1.0.20261020 has no Vulkan MatMul, so in a Vulkan net both MatMuls run on the CPU
    with a download and a submit-and-wait before each (``runtime/vulkan_fallback``): the decode
    layer cannot stay on the GPU, and neither can its cache. Concat and SDPA run on Vulkan (and on
    the CPU), so the variant keeps the whole step on the device. The arithmetic is the same
    function (softmax over the past and the current row; grouped-query heads as ncnn's SDPA maps
    them: head i reads K/V group i // (heads / groups), the order of the ``[groups, per_group, d]``
    query reshape), and local parity against the torch wrapper judges the variant like any other.

    Found by structure, not by name: the past reads are the MatMuls whose second operand is a
    graph input (transB: K, else V); the current rows are the non-terminal outputs of the two
    Splits that also emit a graph output (the new K/V rows the caller stores); the current K row is
    the one whose influence reaches the V MatMul (it enters the softmax). The region replaced is
    everything downstream of the query, the rows and the past up to the first layer outside
    ``WEIGHTLESS_TYPES`` (one that reads weights, or one not known not to); its
    one blob read outside must come from a Reshape, whose shape the SDPA output takes.
    """
    producers, consumers = _producers(graph), _consumers(graph)
    inputs = {b for layer in graph.layers if layer.type == "Input" for b in layer.outputs}
    past = [m for m in graph.layers if m.type == "MatMul" and len(m.inputs) == 2 and m.inputs[1] in inputs]
    mm_k = [m for m in past if m.get("0") == "1"]
    mm_v = [m for m in past if m.get("0") in (None, "0")]
    if len(mm_k) != 1 or len(mm_v) != 1:
        raise ParamError(f"module {module}: rewrite decode_attention_to_sdpa needs one MatMul (transB) reading a "
                         f"past K input and one reading a past V input; found {len(mm_k)} and {len(mm_v)}")
    mm_k, mm_v = mm_k[0], mm_v[0]
    terminal = {b for layer in graph.layers for b in layer.outputs if b not in consumers}
    rows = [b for layer in graph.layers if layer.type == "Split" and any(o in terminal for o in layer.outputs)
            for b in layer.outputs if b not in terminal]
    q_src = _through_splits(mm_k.inputs[0], producers)
    seeds = [q_src, *rows, mm_k.inputs[1], mm_v.inputs[1]]
    region: list[ParamLayer] = []
    ids: set[int] = set()
    todo = list(seeds)
    while todo:
        for layer in consumers.get(todo.pop(), []):
            if id(layer) in ids or layer.type not in WEIGHTLESS_TYPES:
                continue
            ids.add(id(layer))
            region.append(layer)
            todo += layer.outputs
    k_rows = [b for b in rows if _reaches(b, mm_v, consumers, ids)]
    v_rows = [b for b in rows if b not in k_rows]
    if len(k_rows) != 1 or len(v_rows) != 1:
        raise ParamError(f"module {module}: rewrite decode_attention_to_sdpa found current rows {rows}; needs one K "
                         "row (it reaches the V MatMul through the softmax) and one V row")
    made = {b for layer in region for b in layer.outputs}
    leaving = [b for b in made if any(id(c) not in ids for c in consumers.get(b, []))]
    if len(leaving) != 1 or producers[leaving[0]].type != "Reshape":
        raise ParamError(f"module {module}: rewrite decode_attention_to_sdpa: the attention region's outputs read "
                         f"outside it are {sorted(leaving)}; needs exactly one, made by a Reshape")
    out_blob, out_reshape = leaving[0], producers[leaving[0]]
    q_reshape = producers.get(q_src)
    scale = [c for c in consumers.get(mm_k.outputs[0], []) if c.type == "BinaryOp" and c.get("0") == "2"
             and c.get("1") == "1"]
    if q_reshape is None or q_reshape.type != "Reshape" or len(scale) != 1:
        raise ParamError(f"module {module}: rewrite decode_attention_to_sdpa needs the query from a Reshape to "
                         "[groups, per_group, head_dim] and one scalar multiply of the scores")
    try:
        d, per_group, groups = (int(q_reshape.get(k)) for k in ("0", "1", "2"))
    except (TypeError, ValueError):
        raise ParamError(f"module {module}: rewrite decode_attention_to_sdpa: query Reshape {q_reshape.name} has no "
                         "0/1/2 sizes") from None
    heads, tag = groups * per_group, out_reshape.name
    new = [
        ParamLayer("Reshape", f"{tag}_q_heads", [q_src], [f"{tag}_q"], [("0", str(d)), ("1", "1"), ("2", str(heads))]),
        ParamLayer("Concat", f"{tag}_k_all", [mm_k.inputs[1], k_rows[0]], [f"{tag}_k"], [("0", "1")]),
        ParamLayer("Concat", f"{tag}_v_all", [mm_v.inputs[1], v_rows[0]], [f"{tag}_v"], [("0", "1")]),
        ParamLayer("SDPA", f"{tag}_sdpa", [f"{tag}_q", f"{tag}_k", f"{tag}_v"], [f"{tag}_o"],
                   [("5", "0"), ("6", scale[0].get("2")), ("7", "0")]),
        ParamLayer("Reshape", out_reshape.name, [f"{tag}_o"], [out_blob], list(out_reshape.params)),
    ]
    at = max(i for i, layer in enumerate(graph.layers) if id(layer) in ids)
    kept = [layer for i, layer in enumerate(graph.layers) if id(layer) not in ids and i < at]
    kept += new + [layer for i, layer in enumerate(graph.layers) if id(layer) not in ids and i > at]
    graph.layers[:] = kept
    graph.blob_count = len(graph.blob_names())
    return [{"layer": tag, "before": {"removed": sorted(layer.name for layer in region)},
             "after": {"type": "SDPA", "heads": heads, "groups": groups, "head_dim": d, "scale": scale[0].get("2"),
                       "past_k": mm_k.inputs[1], "past_v": mm_v.inputs[1], "k_row": k_rows[0], "v_row": v_rows[0]}}]


REWRITES: dict[str, Callable[..., list[dict]]] = {"gemm_to_innerproduct": gemm_to_innerproduct,
                                                   "decode_attention_to_sdpa": decode_attention_to_sdpa}


def apply_rewrites(graph: ParamGraph, names: tuple[str, ...] | list[str], *, module: str) -> list[dict]:
    """Apply the named rewrites in order; one receipt per rewrite (its changed layers)."""
    receipts = []
    for name in names:
        fn = REWRITES.get(name)
        if fn is None:
            raise ParamError(f"module {module}: unknown graph rewrite {name!r}; known: {', '.join(sorted(REWRITES))}")
        receipts.append({"rewrite": name, "changed": fn(graph, module=module)})
    return receipts
