"""The module contract: the one record every stage reads.

A per-model exporter (``ncnnport.models.<model>.exporter``) returns a list of :class:`ModuleSpec`.
``export`` traces each spec's wrapper and writes its TorchScript file and a JSON copy of the spec;
``convert`` derives the pnnx ``inputshape``/``inputshape2`` from the two sizes of every dynamic
axis and applies the spec's param patches; ``parity`` runs the wrapper in torch and the converted
graph in ncnn on the same inputs and judges them with the spec's tolerances; ``reports`` turns
those numbers into summary.json and Markdown. Generic stages never branch on the model name: all
they know about a model is in these records.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

Dim = int | str  # a fixed size, the name of a dynamic axis, or "axis+K" (e.g. "past+1")

_AXIS_RE = re.compile(r"([a-z_][a-z0-9_]*)(?:\+(\d+))?")


@functools.lru_cache(maxsize=1024)
def parse_axis(dim: str) -> tuple[str, int]:
    """``"past+1"`` -> ``("past", 1)``; ``"seq"`` -> ``("seq", 0)``. Cached: every graph call
    of a decode loop parses the same few axis names of its specs."""
    m = _AXIS_RE.fullmatch(dim)
    if not m:
        raise ValueError(f"bad axis expression {dim!r}: use a name or name+K")
    return m.group(1), int(m.group(2) or 0)

SUPPORTED_DTYPES = ("float32", "int32")


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: its name, symbolic shape and dtype.

    Shapes always carry the leading batch axis of 1 (pnnx treats dim 0 as the batch: a 2-D
    ``[N, D]`` input silently loses N). Names of dynamic axes refer to ``ModuleSpec.axes``.
    """

    name: str
    shape: tuple[Dim, ...]
    dtype: str = "float32"
    feature_axis: int = -1  # the axis parity's worst-row cosine compares (channels for video)

    def __post_init__(self) -> None:
        if not -len(self.shape) <= self.feature_axis < len(self.shape):
            raise ValueError(f"tensor {self.name!r}: feature_axis {self.feature_axis} outside shape {self.shape}")
        if self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"tensor {self.name!r}: dtype {self.dtype!r} not in {SUPPORTED_DTYPES}")
        if not self.shape or self.shape[0] != 1:
            raise ValueError(
                f"tensor {self.name!r}: shape {self.shape} must start with a batch axis of 1 "
                "(pnnx treats dim 0 as batch)")

    def concrete(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """Shape with every named axis replaced by its size in ``sizes``."""
        out = []
        for d in self.shape:
            if isinstance(d, str):
                axis, offset = parse_axis(d)
                if axis not in sizes:
                    raise KeyError(f"tensor {self.name!r}: no size given for axis {axis!r}")
                out.append(int(sizes[axis]) + offset)
            else:
                out.append(int(d))
        return tuple(out)

    def axis_names(self) -> list[str]:
        return [parse_axis(d)[0] for d in self.shape if isinstance(d, str)]


@dataclass(frozen=True)
class ParamPatch:
    """A declarative edit of converted ncnn param lines.

    Every line whose layer type equals ``layer_type`` and whose params match all ``where`` regexes
    (full match on the value of ``key=value``) gets the params in ``set`` written. A patch that
    matches fewer than ``min_matches`` lines is an error: a silent no-op patch is how a baked
    sequence length ships.
    """

    layer_type: str
    where: Mapping[str, str]
    set: Mapping[str, str]
    min_matches: int = 1
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"layer_type": self.layer_type, "where": dict(self.where), "set": dict(self.set),
                "min_matches": self.min_matches, "why": self.why}


@dataclass(frozen=True)
class GraphVariant:
    """A second param file over the same weights: the module's graph with named rewrites applied.

    Why: the best ncnn op for a layer depends on how it is called. pnnx turns a Linear on
    ``[1, seq, H]`` into ``Gemm``, which is fast for multi-row prefill but has no fp16-weight path
    on x86; ``InnerProduct`` reads fp16 weights (half the bytes of a bandwidth-bound decode step)
    but is several times slower on many rows. A variant is written as
    ``<module>.<variant>.ncnn.param`` next to the module's ``.bin``, so the weights are stored once
    and a runtime opens whichever graph suits the call. ``rewrites`` name functions in
    ``ncnnport.convert.rewrites``; ``sizes`` are the axis sizes the variant serves, where local
    parity runs it against the same torch wrapper (empty: every parity size of the module).
    """

    name: str
    rewrites: tuple[str, ...]
    sizes: tuple[Mapping[str, int], ...] = ()
    why: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9_]+", self.name):
            raise ValueError(f"graph variant name {self.name!r}: use lowercase letters, digits, '_'")
        if not self.rewrites:
            raise ValueError(f"graph variant {self.name!r}: names no rewrite, so it would equal the base graph")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rewrites": list(self.rewrites), "sizes": [dict(s) for s in self.sizes],
                "why": self.why}


def variant_param_name(module: str, variant: str) -> str:
    """File name of a module's variant graph (it shares ``<module>.ncnn.bin``)."""
    return f"{module}.{variant}.ncnn.param"


@dataclass(frozen=True)
class Tolerance:
    """Gate for one module output: cosine floor and max_abs relative to max |reference|."""

    min_cosine: float = 0.999999
    max_abs_rel: float = 1e-4
    max_abs_floor: float = 1e-6  # absolute slack for near-zero references

    def max_abs_allowed(self, ref_absmax: float) -> float:
        return max(self.max_abs_rel * ref_absmax, self.max_abs_floor)

    def to_json(self) -> dict[str, float]:
        return dataclasses.asdict(self)


_ROWS_RE = re.compile(r"(.+)@(\d+):(\d+)")


def split_weight_pattern(pattern: str) -> tuple[str, tuple[int, int] | None]:
    """``"lm_head.weight@0:512"`` -> ``("lm_head.weight", (0, 512))``; other patterns -> (pattern, None)."""
    m = _ROWS_RE.fullmatch(pattern)
    if not m:
        return pattern, None
    return m.group(1), (int(m.group(2)), int(m.group(3)))


def check_weight_pattern(pattern: str, where: str) -> None:
    """A weight pattern must be a non-empty name, glob or ``name@start:stop`` with start < stop;
    a stray ``@`` or an empty row range is a typo, never a pattern that silently matches nothing."""
    if not isinstance(pattern, str) or not pattern.strip() or pattern != pattern.strip():
        raise ValueError(f"{where}: weight pattern {pattern!r} must be a non-empty name without spaces")
    name, rows = split_weight_pattern(pattern)
    if "@" in name or (rows is not None and not rows[0] < rows[1]):
        raise ValueError(f"{where}: weight pattern {pattern!r}: rows are written name@start:stop, start < stop")


InputMaker = Callable[[Mapping[str, int], np.random.Generator], Sequence[np.ndarray]]


@dataclass
class ModuleSpec:
    """One exported graph: what to trace, at which sizes, and how to judge it.

    ``build`` returns the traceable wrapper (an ``nn.Module`` over the real model's weights) in
    eval mode. ``axes`` gives, per dynamic axis, the trace size and a second size (pnnx's
    ``inputshape`` and ``inputshape2``); the two must differ. A second size of ``None`` means the
    axis is traced at one size only, allowed only together with ``patches`` that make it dynamic. ``parity_sizes`` lists further
    size assignments for local parity (the two trace sizes are always included). ``make_inputs``
    builds valid example inputs at given sizes (e.g. a causal mask, not random noise, where the
    graph expects one). ``tolerances`` maps output name (or ``"*"``) to its gate.
    """

    name: str
    build: Callable[[], Any]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    axes: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    make_inputs: InputMaker | None = None
    parity_sizes: list[dict[str, int]] = field(default_factory=list)
    patches: list[ParamPatch] = field(default_factory=list)
    tolerances: dict[str, Tolerance] = field(default_factory=dict)
    notes: str = ""
    single_size_reason: str = ""
    variants: list[GraphVariant] = field(default_factory=list)
    # runtime hint read from the spec JSON: return the graph's pooled activation memory after each
    # call (for graphs whose activations are far larger than their weights, e.g. a VAE)
    release_after_call: bool = False
    # under --precision int8-weights, the graph's weight Gemms (any number of rows) run int8 too,
    # not only its matrix-vector products (convert.int8_weights): for compute-bound graphs where
    # ncnn's int8 dot products pay and the model's int8 budgets were measured to hold
    int8_rows: bool = False
    # runtime hint: the pipeline makes up to this many independent calls of the graph at once
    # (Youtu-VL's windows). A session on T threads loads it for ceil(T / concurrent_calls)
    # threads per call (runtime.concurrent_calls.split_threads) and runs the calls side by side
    concurrent_calls: int = 1
    # checkpoint tensors the graph reads, as name patterns over the weight source's names: a
    # prefix (``model.layers.3`` = that name and everything under ``model.layers.3.``), a glob
    # (``*.attn.proj_qkv.*``), or ``name@start:stop`` for rows of one tensor (a vocab shard).
    # Export checks them against the loaded weights (ncnnport.export.weights.bind_weights).
    weights: tuple[str, ...] = ()
    # filled by bind_weights from the loaded source, recorded in the spec JSON: the stored tensor
    # names ``weights`` resolved to, and sha256 per checkpoint file they came from (folders only)
    weight_tensors: tuple[str, ...] = ()
    weight_files: dict[str, str] = field(default_factory=dict)
    # the WeightSource bound above (not recorded): export checks build() read only weight_tensors
    weight_source: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9_]+", self.name):
            raise ValueError(f"module name {self.name!r}: use lowercase letters, digits, '_'")
        used = {a for t in self.inputs for a in t.axis_names()}
        missing = used - set(self.axes)
        if missing:
            raise ValueError(f"module {self.name}: axes {sorted(missing)} have no trace sizes")
        for axis, (a, b) in self.axes.items():
            if b is None and not self.patches and not self.single_size_reason:
                raise ValueError(
                    f"module {self.name}: axis {axis!r} is traced at one size only; that is allowed "
                    "only with param patches that make the baked length dynamic")
            if a == b:
                raise ValueError(
                    f"module {self.name}: axis {axis!r} needs two different sizes, got {a} twice "
                    "(with one size pnnx bakes the length and the graph is silently wrong elsewhere)")
        names = [t.name for t in self.inputs] + [t.name for t in self.outputs]
        if len(set(names)) != len(names):
            raise ValueError(f"module {self.name}: duplicate tensor names {names}")
        for w in self.weights:
            check_weight_pattern(w, f"module {self.name}")
        if self.concurrent_calls < 1:
            raise ValueError(f"module {self.name}: concurrent_calls {self.concurrent_calls} must be >= 1")
        variant_names = [v.name for v in self.variants]
        if len(set(variant_names)) != len(variant_names):
            raise ValueError(f"module {self.name}: duplicate graph variants {variant_names}")
        for v in self.variants:
            for sizes in v.sizes:
                if set(sizes) != set(self.axes):
                    raise ValueError(f"module {self.name}, variant {v.name}: sizes {dict(sizes)} must give "
                                     f"every axis {sorted(self.axes)}")

    # --- sizes -------------------------------------------------------------------------------
    def trace_sizes(self, which: int = 0) -> dict[str, int]:
        """``which=0``: pnnx inputshape; ``which=1``: inputshape2 (a single-size axis keeps its size)."""
        return {axis: (sizes[which] if sizes[which] is not None else sizes[0])
                for axis, sizes in self.axes.items()}

    def has_second_shape(self) -> bool:
        return any(b is not None for _, b in self.axes.values())

    def all_parity_sizes(self) -> list[dict[str, int]]:
        cases = [self.trace_sizes(0)]
        if self.has_second_shape():
            cases.append(self.trace_sizes(1))
        for extra in self.parity_sizes:
            full = {**self.trace_sizes(0), **extra}
            if full not in cases:
                cases.append(full)
        return cases

    def example_inputs(self, sizes: Mapping[str, int], seed: int = 0) -> list[np.ndarray]:
        """Inputs at ``sizes``: from ``make_inputs`` when given, else seeded normal noise."""
        rng = np.random.default_rng(seed)
        if self.make_inputs is not None:
            arrays = [np.ascontiguousarray(a) for a in self.make_inputs(sizes, rng)]
        else:
            arrays = []
            for t in self.inputs:
                shape = t.concrete(sizes)
                if t.dtype == "int32":
                    arrays.append(rng.integers(0, 16, size=shape).astype(np.int32))
                else:
                    arrays.append(rng.standard_normal(shape).astype(np.float32))
        self.check_inputs(arrays, sizes)
        return arrays

    def check_inputs(self, arrays: Sequence[np.ndarray], sizes: Mapping[str, int] | None = None) -> None:
        """Validate count, rank, dtype and (given sizes) exact shape: ncnn would not complain."""
        if len(arrays) != len(self.inputs):
            raise ValueError(f"module {self.name}: expected {len(self.inputs)} inputs, got {len(arrays)}")
        for t, a in zip(self.inputs, arrays):
            if a.ndim != len(t.shape):
                raise ValueError(f"module {self.name}, input {t.name}: rank {a.ndim}, spec {t.shape}")
            if str(a.dtype) != t.dtype:
                raise ValueError(f"module {self.name}, input {t.name}: dtype {a.dtype}, spec {t.dtype}")
            for d, n in zip(t.shape, a.shape):
                if isinstance(d, int) and d != n:
                    raise ValueError(f"module {self.name}, input {t.name}: shape {a.shape}, spec {t.shape}")
            if sizes is not None and tuple(a.shape) != t.concrete(sizes):
                raise ValueError(
                    f"module {self.name}, input {t.name}: shape {a.shape}, expected {t.concrete(sizes)}")

    def to_json(self) -> dict[str, Any]:
        """The JSON record written beside the TorchScript file (everything but the callables)."""
        return {
            "name": self.name,
            "inputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in self.inputs],
            "outputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "feature_axis": t.feature_axis}
                        for t in self.outputs],
            "axes": {k: list(v) for k, v in self.axes.items()},
            "parity_sizes": self.all_parity_sizes(),
            "patches": [p.to_json() for p in self.patches],
            "tolerances": {k: v.to_json() for k, v in self.tolerances.items()},
            "notes": self.notes,
            "single_size_reason": self.single_size_reason,
            "variants": [v.to_json() for v in self.variants],
            "release_after_call": self.release_after_call,
            "int8_rows": self.int8_rows,
            "concurrent_calls": self.concurrent_calls,
            "weights": {"patterns": list(self.weights), "tensors": list(self.weight_tensors),
                        "files": dict(self.weight_files)},
        }


def tensor_specs_from_json(items: Sequence[Mapping[str, Any]]) -> list[TensorSpec]:
    return [TensorSpec(i["name"], tuple(i["shape"]), i["dtype"], i.get("feature_axis", -1)) for i in items]


def variants_from_json(items: Sequence[Mapping[str, Any]]) -> list[GraphVariant]:
    return [GraphVariant(i["name"], tuple(i["rewrites"]), tuple(i.get("sizes", ())), i.get("why", ""))
            for i in items]


def patches_from_json(items: Sequence[Mapping[str, Any]]) -> list[ParamPatch]:
    return [ParamPatch(i["layer_type"], i["where"], i["set"], i.get("min_matches", 1), i.get("why", ""))
            for i in items]
