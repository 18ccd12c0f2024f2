"""int8 weights: the weight products rewritten to ncnn's weight-quantized Gemm.

Two kinds of product become int8 (``int8_package``):

* matrix-vector InnerProducts (decode projections, heads), in every graph: bandwidth-bound,
  where 1-byte weights read a quarter of the fp32 bytes;
* Gemms over a constant transposed weight (``transB=1``, the layout pnnx gives ``nn.Linear`` on
  3-D inputs), any number of rows, in the graphs whose spec sets ``int8_rows``: compute-bound,
  where ncnn's x86 kernels multiply int8 with AVX-512 VNNI / AVX-VNNI dot products (four
  products per 32-bit lane where fp32 FMA does one). Measured on a 2-core Intel Xeon with VNNI,
  one thread: a real-width Youtu-VL vision layer at 448 took 94.5 ms against 217 ms in fp32.
  Opt-in per graph (a model's own choice of where int8 rows pay, measured): Youtu-VL's vision
  tower and merger. Qwen3-ASR's audio encoder and prefill layers stay fp32: not benchmarked in
  int8, and its audio attention projections are a MultiHeadAttention this rewrite leaves fp32.

What ncnn 1.0.20261020 offers (read from its source, ``src/layer/{innerproduct,gemm}.cpp`` and
``x86/gemm_x86.cpp``):

* ``InnerProduct`` with ``8=int8_scale_term``: int8 weights with one scale per output channel,
  but the input scale (``bottom_blob_int8_scales``, one float read from the ``.bin``) is a
  calibrated constant: an activation above it saturates at +-127.
* ``Gemm`` with ``18=quantize_term`` 1..3: one scale for the whole constant B (not per channel).
* ``Gemm`` with ``18=quantize_term`` 8xy (``NCNN_WEIGHT_QUANT``, on in the wheel): constant B
  (``transB=1``, N rows of K) in int8 with one scale per output row and K-block (block 32 / 64 /
  128 for y = 0 / 1 / 2; x = 0: no input smoothing scales), and the input quantized at every call
  per row and block (absmax / 127: dynamic, no calibration). x86 has its own kernels for it
  (``gemm_BT_x86_wq_int8``). This is the one used here: no calibration data, per-channel scales
  refined per block of 128 (for K <= 128 exactly one scale per output channel).

The ``.bin`` layout such a Gemm reads (``Gemm::load_model``): B as raw int8 (N*K bytes padded to
4, no flag word), then C if any (flagged fp32), then the scales as raw fp32 ``[N][blocks]``, each
``127 / absmax`` of its block (``w_int8 = round(w * scale)``, the dot product divided by it).

ncnn's Gemm reads K from ``A.w`` and the rows from ``A.h x elempack``: a 1-D input packed by the
layout pass (w=96 stored as 12 x 8) would be read as K=12. A 1-D InnerProduct input is therefore
reshaped to ``[1, K]`` before the Gemm and its ``[1, N]`` output back to 1-D, so every later layer
sees the shape the InnerProduct produced. The param file does not say a blob's rank, so the
caller passes the ranks measured by running the fp32 graph on its golden inputs
(:func:`probe_input_dims`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ncnnport.contract import variant_param_name
from ncnnport.package.param_file import WEIGHTLESS_TYPES, ParamError, ParamGraph, ParamLayer, read_param

BLOCK_CODES = {32: 0, 64: 1, 128: 2}
DEFAULT_BLOCK = 128
TAG_FP32 = 0x00000000
TAG_FP16 = 0x01306B47
TAG_INT8 = 0x000D4B38

@dataclass(frozen=True)
class Blob:
    """One ``ModelBin::load`` call's bytes in the ``.bin``: where it starts and how long it is."""

    offset: int
    nbytes: int
    tag: int | None  # the flag word of a type-0 load; None for a raw fp32 (type 1) load


def _align4(n: int) -> int:
    return (n + 3) // 4 * 4


class _BinCursor:
    """Sequential reader that mirrors ``ModelBinFromDataReader::load`` for types 0, 1 and 8."""

    def __init__(self, data: bytes, where: str) -> None:
        self.data, self.pos, self.where = data, 0, where

    def _take(self, n: int) -> int:
        start = self.pos
        if start + n > len(self.data):
            raise ParamError(f"{self.where}: .bin ends at {len(self.data)} bytes, a layer needs {start + n}")
        self.pos += n
        return start

    def flagged(self, count: int) -> Blob:
        """A type-0 load: a flag word, then fp32 (tag 0), fp16 or int8 data."""
        tag = int(np.frombuffer(self.data, np.uint32, 1, self._take(4))[0])
        size = {TAG_FP32: 4 * count, TAG_FP16: _align4(2 * count), TAG_INT8: _align4(count)}.get(tag)
        if size is None:
            raise ParamError(f"{self.where}: weight flag {tag:#010x} at byte {self.pos - 4} "
                             "(only fp32, fp16 and int8 weights are walked)")
        return Blob(self._take(size), size, tag)

    def raw_fp32(self, count: int) -> Blob:
        return Blob(self._take(4 * count), 4 * count, None)

    def raw_int8(self, count: int) -> Blob:
        size = _align4(count)
        return Blob(self._take(size), size, None)


def _int(layer: ParamLayer, key: str, default: int = 0) -> int:
    value = layer.get(key)
    return default if value is None else int(float(value))


def _walk_layer(layer: ParamLayer, cur: _BinCursor) -> list[Blob]:
    """The loads ``layer.load_model`` makes, in order (ncnn 1.0.20261020)."""
    t = layer.type
    if t in WEIGHTLESS_TYPES:
        return []
    if t == "InnerProduct":
        blobs = [cur.flagged(_int(layer, "2"))]
        if _int(layer, "1"):
            blobs.append(cur.raw_fp32(_int(layer, "0")))
        if _int(layer, "8"):
            blobs += [cur.raw_fp32(_int(layer, "0")), cur.raw_fp32(1)]
        return blobs
    if t in ("RMSNorm", "LayerNorm"):
        if not _int(layer, "2", 1):  # affine defaults to 1
            return []
        return [cur.raw_fp32(_int(layer, "0")) for _ in range(1 if t == "RMSNorm" else 2)]
    if t == "Embed":
        blobs = [cur.flagged(_int(layer, "3"))]
        if _int(layer, "2"):
            blobs.append(cur.raw_fp32(_int(layer, "0")))
        if _int(layer, "18"):
            blobs.append(cur.raw_fp32(1))
        return blobs
    if t == "MemoryData":
        count = int(np.prod([max(1, _int(layer, k)) for k in ("0", "1", "11", "2")]))
        return [cur.flagged(count) if _int(layer, "21", 1) == 0 else cur.raw_fp32(count)]
    if t == "Gemm":
        return _walk_gemm(layer, cur)
    if t == "Convolution":
        return _walk_convolution(layer, cur)
    if t == "MultiHeadAttention" and not _int(layer, "18"):
        e = _int(layer, "0")
        q, k, v = _int(layer, "2") // max(e, 1), _int(layer, "3", e), _int(layer, "4", e)
        return [cur.flagged(e * q), cur.raw_fp32(e), cur.flagged(e * k), cur.raw_fp32(e),
                cur.flagged(e * v), cur.raw_fp32(e), cur.flagged(q * e), cur.raw_fp32(q)]
    if t == "Padding":
        return [cur.raw_fp32(_int(layer, "6"))] if _int(layer, "6") else []
    raise ParamError(f"{cur.where}: layer {layer.name} of type {t}: the int8 rewrite does not know "
                     "its weight layout")


def _walk_convolution(layer: ParamLayer, cur: _BinCursor) -> list[Blob]:
    """``Convolution::load_model``: weights (flagged), bias, then the int8 scales if any; a
    dynamic-weight convolution reads nothing."""
    if _int(layer, "19"):
        return []
    n, int8 = _int(layer, "0"), _int(layer, "8")
    blobs = [cur.flagged(_int(layer, "6"))]
    if _int(layer, "5"):
        blobs.append(cur.raw_fp32(n))
    if int8:
        blobs += [cur.raw_fp32(n), cur.raw_fp32(1)] + ([cur.raw_fp32(1)] if int8 > 100 else [])
    return blobs


def _walk_gemm(layer: ParamLayer, cur: _BinCursor) -> list[Blob]:
    """``Gemm::load_model`` for the fp32 layouts and this module's own 8x2 weight quantization."""
    g = {k: _int(layer, k) for k in ("2", "3", "4", "5", "6", "7", "8", "9", "18")}
    bc = _int(layer, "10")
    m, n, k, qt = g["7"], g["8"], g["9"], g["18"]
    blobs: list[Blob] = []
    if g["4"]:
        blobs.append(cur.flagged(m * k))
    if g["5"]:
        blobs.append(cur.raw_int8(n * k) if qt >= 400 else cur.flagged(n * k))
    if g["6"] and bc != -1:
        blobs.append(cur.flagged({0: 1, 1: m, 2: m, 3: n * m, 4: n}[bc]))
    if qt >= 400:
        if qt % 100 // 10:
            raise ParamError(f"{cur.where}: Gemm {layer.name} quantize_term {qt}: input scales not walked")
        block = {0: 32, 1: 64, 2: 128}[qt % 10]
        blobs.append(cur.raw_fp32(n * ((k + block - 1) // block)))
    elif qt:
        if g["4"]:
            blobs.append(cur.raw_fp32(m))
        if g["5"]:
            blobs.append(cur.raw_fp32(1))
    return blobs


def walk_bin(graph: ParamGraph, data: bytes, where: str) -> dict[str, list[Blob]]:
    """Each layer's loads in the ``.bin``; the walk must end exactly at the file's end, so a wrong
    layout anywhere is an error here, not garbage weights later."""
    cur = _BinCursor(data, where)
    out = {layer.name: _walk_layer(layer, cur) for layer in graph.layers}
    if cur.pos != len(data):
        raise ParamError(f"{where}: the param's layers read {cur.pos} bytes, the .bin has {len(data)}")
    return out


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C ``round()`` (half away from zero), which ncnn uses; numpy's ``rint`` rounds half to even."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def quantize_blocks(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 of ``w`` ``[N, K]`` per row and K-block: (int8 ``[N, K]``, scales
    ``[N, blocks]``) with ``scale = 127 / absmax`` (1 for an all-zero block), ``q = round(w x
    scale)``; the dequantized weight is ``q / scale``, i.e. steps of absmax / 127."""
    n, k = w.shape
    blocks = (k + block - 1) // block
    q = np.zeros((n, k), np.int8)
    scales = np.ones((n, blocks), np.float32)
    for b in range(blocks):
        part = w[:, b * block:(b + 1) * block].astype(np.float32)
        absmax = np.abs(part).max(axis=1)
        s = np.where(absmax > 0, np.float32(127.0) / np.where(absmax > 0, absmax, 1), 1).astype(np.float32)
        scales[:, b] = s
        q[:, b * block:(b + 1) * block] = np.clip(round_half_away(part * s[:, None]), -127, 127)
    return q, scales


def _weight(data: bytes, blob: Blob, n: int, k: int, where: str) -> np.ndarray:
    if blob.tag == TAG_FP32:
        return np.frombuffer(data, np.float32, n * k, blob.offset).reshape(n, k)
    if blob.tag == TAG_FP16:
        return np.frombuffer(data, np.float16, n * k, blob.offset).astype(np.float32).reshape(n, k)
    raise ParamError(f"{where}: weights already quantized")


def _is_candidate(layer: ParamLayer) -> bool:
    """An InnerProduct this rewrite can express as a weight-quantized Gemm: no fused activation,
    not already int8."""
    return (layer.type == "InnerProduct" and len(layer.inputs) == 1 and not _int(layer, "8")
            and not _int(layer, "9"))


def is_weight_gemm(layer: ParamLayer) -> bool:
    """A Gemm ncnn's weight-quantized path takes as it stands (``Gemm::load_param``'s conditions
    for ``quantize_term`` 8xy): the input as A (not transposed), the weight a constant B stored
    transposed (N rows of K), C constant or absent, the plain output layout, not quantized yet.
    Such a layer only gains ``18=`` and new weight records: its inputs and outputs keep their
    shapes whatever the number of rows."""
    return (layer.type == "Gemm" and len(layer.inputs) == 1 and _int(layer, "2") == 0 and _int(layer, "3") == 1
            and _int(layer, "4") == 0 and _int(layer, "5") == 1 and _int(layer, "18") == 0
            and all(_int(layer, k) == 0 for k in ("11", "12", "13", "14"))
            and _int(layer, "8") > 0 and _int(layer, "9") > 0)


def _quantized_gemm(layer: ParamLayer, block: int) -> ParamLayer:
    """``layer`` (a weight Gemm) reading int8 weights with per-row, per-block scales."""
    params = [p for p in layer.params if p[0] != "18"] + [("18", str(800 + BLOCK_CODES[block]))]
    return ParamLayer("Gemm", layer.name, list(layer.inputs), list(layer.outputs), params)


def _replacement(layer: ParamLayer, dims: int, block: int) -> list[ParamLayer]:
    """The Gemm (bias as a constant C broadcast per column) and, for a 1-D input, the reshapes
    around it that keep the InnerProduct's input and output shapes."""
    n = _int(layer, "0")
    k = _int(layer, "2") // n
    src, dst = layer.inputs[0], layer.outputs[0]
    params = [("0", "1.0"), ("1", "1.0"), ("2", "0"), ("3", "1"), ("4", "0"), ("5", "1"), ("6", "1"),
              ("7", "0"), ("8", str(n)), ("9", str(k)), ("10", "4" if _int(layer, "1") else "-1"),
              ("18", str(800 + BLOCK_CODES[block]))]
    if dims == 2:
        return [ParamLayer("Gemm", layer.name, [src], [dst], params)]
    a, y = f"{layer.name}_i8a", f"{layer.name}_i8y"
    return [ParamLayer("Reshape", f"{layer.name}_i8in", [src], [a], [("0", str(k)), ("1", "1")]),
            ParamLayer("Gemm", layer.name, [a], [y], params),
            ParamLayer("Reshape", f"{layer.name}_i8out", [y], [dst], [("0", str(n))])]


def rewrite_graph(param: Path, weights: Path, out_param: Path, out_bin: Path,
                  input_dims: Mapping[str, int], block: int = DEFAULT_BLOCK,
                  variants: Sequence[tuple[Path, Path]] = (), gemms: bool = False) -> list[dict[str, Any]]:
    """Write ``out_param``/``out_bin`` with every InnerProduct named in ``input_dims`` (its input
    blob's ncnn dims: 1 or 2) and, with ``gemms``, every weight Gemm (:func:`is_weight_gemm`) as
    an int8 weight-quantized Gemm; one receipt per layer.
    ``variants`` (source, destination) are param files sharing ``weights``: each gets the same
    layer replacements, so it reads the new ``.bin`` (see :func:`shares_layout`)."""
    if block not in BLOCK_CODES:
        raise ValueError(f"int8 block size {block}: ncnn supports {', '.join(map(str, BLOCK_CODES))}")
    graph = read_param(param)
    data = Path(weights).read_bytes()
    loads = walk_bin(graph, data, str(weights))
    chunks: list[bytes] = []
    layers: list[ParamLayer] = []
    receipts = []
    replacements: dict[str, Callable[[ParamLayer], list[ParamLayer]]] = {}
    raw = lambda b: data[b.offset - (4 if b.tag is not None else 0):b.offset + b.nbytes]  # noqa: E731  a record, flag word included
    for layer in graph.layers:
        dims = input_dims.get(layer.name)
        gemm = gemms and is_weight_gemm(layer)
        if not gemm and (dims not in (1, 2) or not _is_candidate(layer)):
            layers.append(layer)
            chunks += [raw(b) for b in loads[layer.name]]
            continue
        n = _int(layer, "8") if gemm else _int(layer, "0")
        k = _int(layer, "9") if gemm else _int(layer, "2") // n
        w = _weight(data, loads[layer.name][0], n, k, f"{weights} layer {layer.name}")
        q, scales = quantize_blocks(w, block)
        chunks.append(q.tobytes() + b"\0" * (_align4(q.size) - q.size))
        if gemm:  # C (if any) stays the flagged record it was; the scales follow it
            chunks += [raw(b) for b in loads[layer.name][1:]]
        elif _int(layer, "1"):  # bias: Gemm reads C as a flagged fp32 load
            bias = loads[layer.name][1]
            chunks.append(np.uint32(TAG_FP32).tobytes() + data[bias.offset:bias.offset + bias.nbytes])
        chunks.append(scales.tobytes())
        if gemm:
            replacements[layer.name] = lambda lay: [_quantized_gemm(lay, block)]
        else:
            replacements[layer.name] = lambda lay, d=dims: _replacement(lay, d, block)
        layers += replacements[layer.name](layer)
        receipts.append({"layer": layer.name, "n": n, "k": k, "block": block,
                         "input_dims": "rows" if gemm else dims,
                         "bytes_before": loads[layer.name][0].nbytes, "bytes_after": _align4(q.size) + scales.nbytes})
    added = len(layers) - len(graph.layers)
    ParamGraph(Path(out_param), layers, graph.blob_count + added).write(Path(out_param))
    Path(out_bin).write_bytes(b"".join(chunks))
    for src, dst in variants:
        variant = read_param(src)
        out = [m for layer in variant.layers
               for m in (replacements[layer.name](layer) if layer.name in replacements else [layer])]
        ParamGraph(Path(dst), out, variant.blob_count + len(out) - len(variant.layers)).write(Path(dst))
    return receipts


def shares_layout(base: Path, variant: Path, weights: Path) -> bool:
    """Whether a variant param reads ``weights`` exactly as its base graph does: the same layers
    (name, type, parameters) load the same bytes in the same order. Then the int8 rewrite of the
    base's layers applies to the variant unchanged (a variant that only rewired weightless layers,
    e.g. ``decode_attention_to_sdpa``); a variant that changed a weighted layer's type (Youtu-VL's
    Gemm -> InnerProduct decode graphs) does not share it."""
    data = Path(weights).read_bytes()
    a, b = read_param(base), read_param(variant)
    loads_a, loads_b = walk_bin(a, data, str(weights)), walk_bin(b, data, str(weights))
    key = lambda g, loads: [(layer.name, layer.type, tuple(layer.params), [(x.offset, x.nbytes) for x in loads[layer.name]])
                            for layer in g.layers if loads[layer.name]]
    return key(a, loads_a) == key(b, loads_b)


def probe_input_dims(param: Path, weights: Path, spec: Mapping[str, Any],
                     cases: Sequence[Any]) -> dict[str, int]:
    """ncnn dims of each InnerProduct's input when the fp32 graph runs its golden cases, for the
    layers whose input is one row on every case (a matrix-vector product: weight-bandwidth bound,
    where int8 weights pay); a layer with more rows or another rank is left out."""
    import ncnn

    from ncnnport.runtime.mats import to_mat
    from ncnnport.runtime.options import RuntimeOptions

    graph = read_param(param)
    targets = {layer.inputs[0]: layer.name for layer in graph.layers if _is_candidate(layer)}
    if not targets:
        return {}
    net = ncnn.Net()
    RuntimeOptions(num_threads=1).apply(net.opt)
    net.opt.use_packing_layout = False  # dims as the layer sees them, unpacked
    if net.load_param(str(param)) != 0 or net.load_model(str(weights)) != 0:
        raise ParamError(f"{param}: ncnn could not load the graph to probe its InnerProduct inputs")
    seen: dict[str, set[tuple[int, int]]] = {name: set() for name in targets.values()}
    names = [t["name"] for t in spec["inputs"]]
    for case in cases:
        ex = net.create_extractor()
        alive = []
        for name, arr in zip(names, case.inputs):
            mat, buf = to_mat(np.asarray(arr), what=f"{param.name} input {name}")
            alive.append((mat, buf))
            ex.input(name, mat)
        for blob, layer in targets.items():
            rc, mat = ex.extract(blob)
            if rc != 0:
                raise ParamError(f"{param}: probing blob {blob} of {layer} returned {rc}")
            seen[layer].add((mat.dims, mat.h if mat.dims >= 2 else 1))
        del alive, ex
    return {layer: next(iter(s))[0] for layer, s in seen.items()
            if len(s) == 1 and next(iter(s)) in ((1, 1), (2, 1))}


def int8_package(src: Path, out: Path, block: int = DEFAULT_BLOCK) -> dict[str, list[dict[str, Any]]]:
    """Write ``out`` (a new folder): a copy of the fp32 package ``src`` with every graph's
    matrix-vector InnerProducts in int8, and the weight Gemms of the graphs whose spec sets
    ``int8_rows`` (:func:`rewrite_graph`), ``model.json``'s ``precision``
    set to ``int8-weights``, the manifest re-hashed and the rewrite's receipts added to its
    commands. A graph with variants (param files sharing its ``.bin``) is rewritten with them
    when every variant reads the ``.bin`` as the base does (:func:`shares_layout`); otherwise it
    is copied unchanged (a new ``.bin`` layout would break the variants)."""
    from ncnnport.fsutil import read_json
    from ncnnport.package.golden import golden_path, read_golden
    from ncnnport.package.manifest import write_manifest
    from ncnnport.package.model_json import MODEL_JSON, set_precision

    if out.exists():
        raise FileExistsError(f"{out}: the int8 package is written into a new folder")
    shutil.copytree(src, out)
    manifest = read_json(src / "manifest.json")
    receipts: dict[str, list[dict[str, Any]]] = {}
    for name in manifest.get("modules", []):
        param, weights = src / "ncnn" / f"{name}.ncnn.param", src / "ncnn" / f"{name}.ncnn.bin"
        spec = read_json(src / "specs" / f"{name}.spec.json")
        variants = [variant_param_name(name, v["name"]) for v in spec.get("variants", [])]
        if not all(shares_layout(param, src / "ncnn" / v, weights) for v in variants):
            continue
        dims = probe_input_dims(param, weights, spec, read_golden(golden_path(src, name)))
        gemms = bool(spec.get("int8_rows")) and any(is_weight_gemm(layer) for layer in read_param(param).layers)
        if dims or gemms:
            receipts[name] = rewrite_graph(param, weights, out / "ncnn" / param.name,
                                           out / "ncnn" / weights.name, dims, block,
                                           [(src / "ncnn" / v, out / "ncnn" / v) for v in variants], gemms)
    if (out / MODEL_JSON).is_file():  # the copy says it holds int8 weights (verify judges it so)
        set_precision(out, "int8-weights")
    commands = list(manifest.get("pnnx_commands", [])) + [{"int8_weights": receipts}]
    write_manifest(out, model=manifest["model"], source=manifest["source"],
                   config_hash=manifest["config_sha256"], build_key=manifest["build_key"],
                   commands=commands, memory=manifest.get("memory"), modules=manifest.get("modules"))
    return receipts
