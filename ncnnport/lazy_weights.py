"""Lazy weights: build one module at a time without ever materialising the whole model.

Why: a real checkpoint (or a seeded stand-in at real widths) is several GB in float32, while one
exported graph needs only its own layer. Export therefore asks a :class:`WeightSource` for the
tensors of ONE module, builds that module, traces it and drops it; peak memory is one module.

Two sources behind one interface:

* :class:`SeededSource` - every tensor is a deterministic function of ``(seed, name, shape)`` and
  of an init rule (mean/std per tensor), generated on demand. Asking for layer 3 alone gives the
  same numbers as layer 3 of a full build, on any machine, in any order.
* :class:`SafetensorsSource` - a local checkpoint folder (``model.safetensors`` or a sharded
  ``model.safetensors.index.json``), read tensor by tensor with ``safe_open``: only requested
  tensors are read. Pickle files are never opened.

:func:`empty_module` constructs a module with parameters on the ``meta`` device (no memory) but
real buffers (non-persistent buffers such as RoPE ``inv_freq`` or sinusoid tables are computed by
constructors and are not in any checkpoint); :func:`materialize` fills the parameters of a
(deep-copied) submodule from a source by their full names.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"


class WeightSourceError(KeyError):
    """A requested tensor does not exist in the source (or has another shape)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class WeightSource(ABC):
    """Tensors by full name, produced on demand as float32 CPU tensors.

    ``aliases`` maps a name to the name it is tied to (``lm_head.weight`` ->
    ``model.embed_tokens.weight``): asking for the alias returns the target's values.
    ``reads`` counts every tensor produced (name -> times), so callers and tests can prove that
    a build touched only its own module.
    """

    def __init__(self, aliases: Mapping[str, str] | None = None) -> None:
        self.aliases = dict(aliases or {})
        self.reads: dict[str, int] = {}

    @abstractmethod
    def _names(self) -> list[str]:
        """Names stored in the source (aliases excluded)."""

    @abstractmethod
    def _shape(self, name: str) -> tuple[int, ...]:
        ...

    @abstractmethod
    def _load(self, name: str) -> torch.Tensor:
        ...

    # --- public interface ----------------------------------------------------------------------
    def names(self) -> list[str]:
        stored = self._names()
        return stored + [a for a in self.aliases if a not in set(stored)]

    def stored_names(self) -> list[str]:
        """Names the source holds itself (what a checkpoint file stores; aliases excluded)."""
        return list(self._names())

    def file_of(self, name: str) -> Path | None:
        """The checkpoint file a stored tensor is read from (None: not read from a file)."""
        return None

    def resolve(self, name: str) -> str:
        if name in self.aliases and name not in set(self._names()):
            return self.aliases[name]
        return name

    def shape(self, name: str) -> tuple[int, ...]:
        real = self.resolve(name)
        if real not in set(self._names()):
            raise WeightSourceError(f"{self.describe()}: no tensor {name!r}")
        return tuple(self._shape(real))

    def get(self, name: str, shape: Sequence[int] | None = None) -> torch.Tensor:
        real = self.resolve(name)
        if real not in set(self._names()):
            raise WeightSourceError(f"{self.describe()}: no tensor {name!r}")
        if shape is not None and tuple(self._shape(real)) != tuple(shape):
            raise WeightSourceError(f"{self.describe()}: tensor {name!r} has shape "
                                    f"{tuple(self._shape(real))}, expected {tuple(shape)}")
        self.reads[real] = self.reads.get(real, 0) + 1
        t = self._load(real)
        return t if t.dtype == torch.float32 else t.to(torch.float32)

    def get_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of a tensor (a vocab shard of a 2.8 GB table) without holding the
        rest: sources that can read a slice override :meth:`_load_rows`."""
        real = self.resolve(name)
        if real not in set(self._names()):
            raise WeightSourceError(f"{self.describe()}: no tensor {name!r}")
        rows = self._shape(real)[0]
        if not 0 <= start < stop <= rows:
            raise WeightSourceError(f"{self.describe()}: rows {start}:{stop} of {name!r} outside 0:{rows}")
        self.reads[real] = self.reads.get(real, 0) + 1
        t = self._load_rows(real, start, stop)
        return t if t.dtype == torch.float32 else t.to(torch.float32)

    def _load_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self._load(name)[start:stop].clone()

    def tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """Every tensor under ``prefix.`` keyed by its name relative to the prefix."""
        p = prefix + "." if prefix else ""
        return {n[len(p):]: self.get(n) for n in self.names() if n.startswith(p)}

    def nbytes(self, prefix: str = "") -> int:
        """float32 bytes of the tensors under ``prefix`` (no tensor is read)."""
        p = prefix + "." if prefix else ""
        total = 0
        for n in self.names():
            if n.startswith(p) or n == prefix:
                numel = 1
                for d in self.shape(n):
                    numel *= int(d)
                total += 4 * numel
        return total

    def describe(self) -> str:
        return type(self).__name__


# --- seeded source ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Init:
    """Values ``mean + std * N(0, 1)``; ``std == 0`` gives the constant ``mean``."""

    mean: float = 0.0
    std: float = 0.0


InitRule = Callable[[str, tuple[int, ...]], Init]


def tensor_seed(seed: int, name: str, shape: Sequence[int]) -> int:
    """A 63-bit generator seed from (seed, name, shape): stable across runs and machines."""
    key = f"{int(seed)}|{name}|{','.join(str(int(d)) for d in shape)}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & ((1 << 63) - 1)


ROW_BLOCK = 8192  # rows per seeded block of a large tensor (row-range reads cost only their blocks)


class SeededSource(WeightSource):
    """Deterministic per-tensor values: ``rule(name, shape)`` gives mean/std, the generator is
    seeded from ``(seed, name, shape)`` only, so each tensor is independent of every other."""

    def __init__(self, shapes: Mapping[str, Sequence[int]], rule: InitRule, seed: int = 0,
                 aliases: Mapping[str, str] | None = None) -> None:
        super().__init__(aliases)
        self.shapes = {k: tuple(int(d) for d in v) for k, v in shapes.items() if k not in (aliases or {})}
        self.rule = rule
        self.seed = int(seed)

    def _names(self) -> list[str]:
        return list(self.shapes)

    def _shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def _load(self, name: str) -> torch.Tensor:
        return self._load_rows(name, 0, self.shapes[name][0] if self.shapes[name] else 1)

    def _load_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Tensors of more than ``ROW_BLOCK`` rows are generated in row blocks, each from its own
        seed, so any row range costs only its blocks (a vocab shard never builds the table)."""
        shape = self.shapes[name]
        init = self.rule(name, shape)
        if not shape:  # a scalar
            start, stop = 0, 1
        out_shape = (stop - start, *shape[1:]) if shape else ()
        if init.std == 0.0:
            return torch.full(out_shape, float(init.mean), dtype=torch.float32)
        if not shape or shape[0] <= ROW_BLOCK:
            gen = torch.Generator().manual_seed(tensor_seed(self.seed, name, shape))
            t = torch.randn(shape, generator=gen, dtype=torch.float32)
            t = t if (start, stop) == (0, shape[0] if shape else 1) else t[start:stop].clone()
        else:
            t = torch.empty(out_shape, dtype=torch.float32)
            for block in range(start // ROW_BLOCK, (stop - 1) // ROW_BLOCK + 1):
                a, b = block * ROW_BLOCK, min(shape[0], (block + 1) * ROW_BLOCK)
                gen = torch.Generator().manual_seed(tensor_seed(self.seed, f"{name}#rows{block}", shape))
                rows = torch.randn((b - a, *shape[1:]), generator=gen, dtype=torch.float32)
                lo, hi = max(a, start), min(b, stop)
                t[lo - start:hi - start] = rows[lo - a:hi - a]
        t.mul_(float(init.std))
        if init.mean:
            t.add_(float(init.mean))
        return t

    def describe(self) -> str:
        return f"seeded weights (seed {self.seed})"


# --- in-memory source ---------------------------------------------------------------------------
class TensorsSource(WeightSource):
    """Tensors already in memory (a model built whole), so the generic weight checks and byte
    counts read one interface whether a model is lazy or not."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], aliases: Mapping[str, str] | None = None) -> None:
        super().__init__(aliases)
        self._tensors = dict(tensors)

    def _names(self) -> list[str]:
        return list(self._tensors)

    def _shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensors[name].shape)

    def _load(self, name: str) -> torch.Tensor:
        return self._tensors[name].detach()

    def describe(self) -> str:
        return "weights in memory"


# --- safetensors source -------------------------------------------------------------------------
def read_weight_map(index: Path) -> dict[str, str]:
    """The ``weight_map`` of a sharded checkpoint's index, checked: tensor name -> shard file."""
    from ncnnport.fsutil import read_json

    data = read_json(index)
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise ValueError(f"{index}: field 'weight_map' must be an object of tensor name -> shard file")
    return wm


def checkpoint_shards(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder: ``model.safetensors`` or every shard named by
    the index. Pickle weights are refused with a hint; every loader in the project uses this."""
    folder = Path(folder)
    single = folder / WEIGHTS_NAME
    if single.is_file():
        return [single]
    index = folder / INDEX_NAME
    if index.is_file():
        weight_map = read_weight_map(index)
        files = [folder / shard for shard in sorted(set(weight_map.values()))]
        missing = [str(p) for p in files if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"{folder}: shards listed in {INDEX_NAME} are missing: {missing}")
        return files
    pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
    hint = f" (found {pickles}: pickle weights are refused; convert them to safetensors)" if pickles else ""
    raise FileNotFoundError(f"{folder}: no {WEIGHTS_NAME} or {INDEX_NAME}{hint}")


@contextlib.contextmanager
def open_safetensors(path: Path) -> Iterator[Any]:
    """``safe_open`` with a damaged file (bad header, truncated, not safetensors at all) turned
    into a ValueError naming the file, instead of the library's bare message."""
    from safetensors import safe_open

    try:
        handle = safe_open(str(path), framework="pt")
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - SafetensorError derives from Exception only
        raise ValueError(f"{path}: not a readable safetensors file ({exc})") from None
    with handle as f:
        yield f


def refuse_non_float(tensor: torch.Tensor, name: str, path: Path) -> torch.Tensor:
    """Weights must be floating point: an integer or bool tensor where a weight is expected is a
    wrong or damaged checkpoint, never something to cast silently."""
    if not tensor.dtype.is_floating_point:
        raise ValueError(f"{path}: tensor {name!r} has dtype {str(tensor.dtype).replace('torch.', '')}; "
                         "weights must be floating point")
    return tensor


def weight_files(folder: Path) -> dict[str, Path]:
    """tensor name -> file, from ``model.safetensors`` or the sharded index (no tensor read)."""
    folder = Path(folder)
    shards = checkpoint_shards(folder)
    index = folder / INDEX_NAME
    if shards == [folder / WEIGHTS_NAME] or not index.is_file():
        out: dict[str, Path] = {}
        for shard in shards:
            with open_safetensors(shard) as f:
                out.update({k: shard for k in f.keys()})
        return out
    return {name: folder / shard for name, shard in read_weight_map(index).items()}


class SafetensorsSource(WeightSource):
    """Tensors of a local checkpoint folder, each read on request (``safe_open`` per read, so
    no file stays mapped between module builds)."""

    def __init__(self, folder: Path, aliases: Mapping[str, str] | None = None,
                 rename: Callable[[str], str] | None = None) -> None:
        super().__init__(aliases)

        self.folder = Path(folder)
        self.files = weight_files(self.folder)
        self._shapes: dict[str, tuple[int, ...]] = {}
        for path in sorted(set(self.files.values())):
            with open_safetensors(path) as f:
                for k in f.keys():
                    if self.files.get(k) == path:
                        self._shapes[k] = tuple(f.get_slice(k).get_shape())
        missing = sorted(set(self.files) - set(self._shapes))
        if missing:
            raise FileNotFoundError(f"{self.folder}: index lists tensors absent from their shard: {missing[:8]}")

    def _names(self) -> list[str]:
        return list(self._shapes)

    def _shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def file_of(self, name: str) -> Path | None:
        return self.files.get(name)

    def _key(self, name: str) -> str:
        """The tensor's key inside its file (a subclass may prefix names by file)."""
        return name

    def _load(self, name: str) -> torch.Tensor:
        with open_safetensors(self.files[name]) as f:
            t = refuse_non_float(f.get_tensor(self._key(name)), name, self.files[name])
        # float32 stays a view of the mapped file (page cache, released with the tensor): a clone
        # would hold the file pages AND an anonymous copy, twice the module at the peak
        return t if t.dtype == torch.float32 else t.to(torch.float32)

    def _load_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        with open_safetensors(self.files[name]) as f:
            return refuse_non_float(f.get_slice(self._key(name))[start:stop], name, self.files[name])

    def describe(self) -> str:
        return f"checkpoint {self.folder}"


# --- building modules ---------------------------------------------------------------------------
@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Construct modules with every parameter on ``meta`` (no memory, no init cost) while
    buffers stay real: constructors still compute RoPE / sinusoid tables."""
    original = nn.Module.register_parameter

    def register(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(self, name, param)
        p = self._parameters.get(name)
        if p is not None and p.device.type != "meta":
            self._parameters[name] = nn.Parameter(p.to("meta"), requires_grad=p.requires_grad)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def empty_module(factory: Callable[[], nn.Module]) -> nn.Module:
    with parameters_on_meta():
        return factory()


def parameter_shapes(module: nn.Module, prefix: str = "") -> dict[str, tuple[int, ...]]:
    """Full name -> shape of every parameter (tied parameters appear under each name)."""
    p = prefix + "." if prefix else ""
    return {p + n: tuple(t.shape) for n, t in module.named_parameters(remove_duplicate=False)}


def parameter_owners(module: nn.Module) -> dict[str, nn.Module]:
    """Full parameter name -> the module that registers it (init rules classify by its type)."""
    owners: dict[str, nn.Module] = {}
    for mname, mod in module.named_modules():
        for pname, _ in mod.named_parameters(recurse=False):
            owners[f"{mname}.{pname}" if mname else pname] = mod
    return owners


def materialize(module: nn.Module, source: WeightSource, prefix: str, *, copy_module: bool = True) -> nn.Module:
    """A copy of ``module`` (whose parameters may be on meta) with every parameter read from
    ``source`` under ``prefix``. Tied parameters inside the module stay tied. Only this module's
    tensors are read; the source's other tensors are never touched."""
    mod = copy.deepcopy(module) if copy_module else module
    p = prefix + "." if prefix else ""
    seen: dict[int, torch.Tensor] = {}
    for sub_name, sub in mod.named_modules():
        for pname, param in list(sub._parameters.items()):
            if param is None:
                continue
            key = id(param)
            if key in seen:
                sub._parameters[pname] = seen[key]  # type: ignore[assignment]
                continue
            full = p + (f"{sub_name}.{pname}" if sub_name else pname)
            value = nn.Parameter(source.get(full, tuple(param.shape)), requires_grad=False)
            seen[key] = value
            sub._parameters[pname] = value
    return mod


def release(module: nn.Module) -> None:
    """Move every parameter of ``module`` back to meta (frees its memory in place)."""
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None and param.device.type != "meta":
                sub._parameters[name] = nn.Parameter(param.detach().to("meta"), requires_grad=False)


class LazyModel:
    """A model built one submodule at a time: a parameter-free ``skeleton`` and a weight
    ``source``. ``part(path)`` materialises one submodule (only its tensors are read); the whole
    model is built by ``full()`` (a subclass's ``_build_full``) or by any attribute this object
    lacks, so code written against the eager model keeps working. Once the whole model exists,
    ``part`` returns its submodules: wrappers built after the reference share its weights.

    Construction checks every skeleton parameter against the source (name and shape) and raises
    ``error_type`` naming what is missing: a missing tensor is never a silent random init."""

    error_type: type[Exception] = WeightSourceError
    model_name = "model"
    OWN = ("source", "skeleton")

    def __init__(self, skeleton: nn.Module, source: WeightSource) -> None:
        self.skeleton = skeleton
        self.source = source
        self._full: nn.Module | None = None
        problems = self.name_problems()
        if problems:
            raise self.error_type(f"{source.describe()} does not match {self.model_name}: " + " | ".join(problems))

    def name_problems(self) -> list[str]:
        names = set(self.source.names())
        missing, bad = [], []
        for name, shape in parameter_shapes(self.skeleton).items():
            if name not in names:
                missing.append(name)
            elif tuple(self.source.shape(name)) != tuple(shape):
                bad.append(f"{name}: source {tuple(self.source.shape(name))} vs model {tuple(shape)}")
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} tensor(s): {sorted(missing)[:8]}"
                         f"{' ...' if len(missing) > 8 else ''}")
        if bad:
            parts.append("shape mismatch: " + "; ".join(bad[:8]))
        return parts

    def part(self, path: str) -> nn.Module:
        if self._full is not None:
            return self._full.get_submodule(path)
        return materialize(self.skeleton.get_submodule(path), self.source, path).eval()

    def part_bytes(self, path: str) -> int:
        """float32 bytes of submodule ``path``'s parameters (nothing is read)."""
        return self.source.nbytes(path)

    def _build_full(self) -> nn.Module:
        raise NotImplementedError

    def full(self) -> nn.Module:
        if self._full is None:
            self._full = self._build_full()
        return self._full

    @property
    def is_materialized(self) -> bool:
        return self._full is not None

    def release(self) -> None:
        """Drop the whole model ``full()`` built (``part``/``full`` rebuild it on demand), so a
        caller that no longer runs the reference (``bench-cpp --no-torch``) does not hold it."""
        self._full = None

    def __getattr__(self, name: str):
        # only reached for attributes this object lacks: delegate to the whole model
        if name.startswith("_") or name in type(self).OWN:
            raise AttributeError(name)
        return getattr(self.full(), name)
