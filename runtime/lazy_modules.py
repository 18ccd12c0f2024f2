"""A package's graphs as a lazy mapping: each ``NcnnModule`` is opened on first access.

``open_ncnn_modules`` opens every graph of a package up front, so a pipeline that only ever
needs a few graphs at once (one transformer block after another) still holds all of them.
``LazyModules`` checks the package against its manifest once, then opens a graph only when it
is looked up and keeps it until ``release(name)``. Iteration, ``len`` and ``in`` see every
graph of the package without opening any; ``.values()``/``.items()`` open them (like a dict).

Every open and release is logged in ``events`` so callers and tests can see what was resident
when (``peak_live``, ``live_peak(pred)``) without relying on RSS or timing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from ncnnport.package.reader import PackageReader, open_package
from ncnnport.runtime.options import FP32, RuntimeOptions


class _Resident(Mapping[str, Any]):
    """name -> module, opened (``_open_module``) on first lookup and held until ``release(name)``;
    every open and release is logged in ``events``."""

    def __init__(self, specs: Mapping[str, Any]) -> None:
        self._specs = dict(specs)
        self._open: dict[str, Any] = {}
        self.events: list[tuple[str, str]] = []   # ("open" | "release", name), in order
        self.opens = 0
        self.peak_live = 0

    def _open_module(self, name: str) -> Any:
        raise NotImplementedError

    # --- Mapping ---------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        mod = self._open.get(name)
        if mod is not None:
            return mod
        if name not in self._specs:
            raise KeyError(name)
        mod = self._open[name] = self._open_module(name)
        self.opens += 1
        self.events.append(("open", name))
        self.peak_live = max(self.peak_live, len(self._open))
        return mod

    def __contains__(self, name: object) -> bool:   # without opening (Mapping's default would)
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    # --- residency -------------------------------------------------------------------------------
    def release(self, name: str) -> None:
        """Drop the open graph (its ncnn.Net and weights go with the last reference)."""
        if self._open.pop(name, None) is not None:
            self.events.append(("release", name))

    def release_all(self) -> None:
        for name in list(self._open):
            self.release(name)

    @property
    def live(self) -> list[str]:
        """Names of the graphs open right now."""
        return list(self._open)

    def live_peak(self, pred: Callable[[str], bool]) -> int:
        """Most graphs satisfying ``pred`` that were open at the same time."""
        live, peak = set(), 0
        for kind, name in self.events:
            if not pred(name):
                continue
            (live.add if kind == "open" else live.discard)(name)
            peak = max(peak, len(live))
        return peak


def _ncnn_module(reader: PackageReader, name: str, options: RuntimeOptions) -> Any:
    """One graph of a checked package as an ``NcnnModule`` (its own Net and options)."""
    from ncnnport.runtime.session import NcnnModule

    return NcnnModule(reader.param(name), reader.bin(name), reader.specs[name], options)


def open_ncnn_modules(package: Path, names: Sequence[str] | None = None,
                      options: RuntimeOptions = FP32) -> dict[str, Any]:
    """Every graph of a package (or ``names``) opened now, one ``NcnnModule`` each."""
    reader = open_package(package)
    return {n: _ncnn_module(reader, n, options) for n in reader.select(names)}


class LazyModules(_Resident):
    """name -> NcnnModule, opened on first ``[name]`` and held until ``release(name)``."""

    def __init__(self, package: Path, options: RuntimeOptions = FP32,
                 names: Sequence[str] | None = None, *, _reader: PackageReader | None = None) -> None:
        self.package = Path(package)
        self.options = options
        self._reader = _reader if _reader is not None else open_package(self.package)  # checked once, never per open
        super().__init__(self._reader.select(names))

    def _open_module(self, name: str) -> Any:
        return _ncnn_module(self._reader, name, self.options)

    def spec(self, name: str) -> Mapping[str, Any]:
        return self._specs[name]

    def with_options(self, options: RuntimeOptions) -> "LazyModules":
        """The same package under other runtime options (nothing opened, no re-validation)."""
        return LazyModules(self.package, options, list(self._specs), _reader=self._reader)


class LazyTorchModules(_Resident):
    """name -> TorchModule over the spec's wrapper, built on first lookup and held until
    ``release(name)``. Why: at real size every ``build()`` reads its module's weights, so building
    all wrappers up front holds a second copy of the whole model next to the ncnn one; parity
    walks the specs one pair at a time instead."""

    def __init__(self, specs: Sequence[Any]) -> None:
        super().__init__({s.name: s for s in specs})

    def _open_module(self, name: str) -> Any:
        from ncnnport.runtime.session import TorchModule

        spec = self._specs[name]
        return TorchModule(spec.build(), spec.to_json())
