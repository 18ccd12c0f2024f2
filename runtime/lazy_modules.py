"""The one runner lifecycle: a package's graphs (or a model's torch wrappers) as a mapping whose
entries are opened on first use and held until released.

``open_ncnn_modules`` opens every graph of a package up front, so a pipeline that only ever
needs a few graphs at once (one transformer block after another) still holds all of them.
:class:`Runners` opens a runner only when it is asked for (``open(name)``, ``get(name)`` or
``[name]``) and keeps it until ``release(name)``; ``resident=N`` keeps at most N open, releasing
the longest-open one when another is opened (a pipeline walking graphs in order then holds N at
a time, the streamed parity's one-module residency). Iteration, ``len`` and ``in`` see every
name without opening any; ``.values()``/``.items()`` open them (like a dict). What a runner is
comes from the opener: :class:`LazyModules` opens ``NcnnModule``s from a checked package,
:class:`LazyTorchModules` builds ``TorchModule``s from specs, :meth:`Runners.over` serves an
already-open mapping with the same lifecycle.

Every open and release is logged in ``events`` so callers and tests can see what was resident
when (``peak_live``, ``live_peak(pred)``, ``opened(pred)``) without relying on RSS or timing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from ncnnport.package.reader import PackageReader, open_package
from ncnnport.runtime.options import FP32, RuntimeOptions


class Runners(Mapping[str, Any]):
    """name -> runner, opened by ``opener(name)`` on first use and held until ``release(name)``
    (or, with ``resident``, until that many others were opened after it); every open and release
    is logged in ``events``."""

    def __init__(self, specs: Mapping[str, Any], opener: Callable[[str], Any] | None = None,
                 resident: int | None = None) -> None:
        if resident is not None and resident < 1:
            raise ValueError(f"resident must be >= 1 (or None: no limit), got {resident}")
        self._specs = dict(specs)
        self._opener = opener
        self.resident = resident
        self._open: dict[str, Any] = {}           # insertion order = opening order
        self.events: list[tuple[str, str]] = []   # ("open" | "release", name), in order
        self.opens = 0
        self.peak_live = 0

    @classmethod
    def over(cls, modules: Mapping[str, Any], resident: int | None = None) -> "Runners":
        """The lifecycle over runners that are already open (``open_ncnn_modules``, a test's
        fakes): opening hands out the mapping's runner, releasing drops this view's hold."""
        return cls({n: None for n in modules}, modules.__getitem__, resident)

    def _open_module(self, name: str) -> Any:
        if self._opener is None:
            raise NotImplementedError(f"{type(self).__name__}: no opener")
        return self._opener(name)

    # --- lifecycle -------------------------------------------------------------------------------
    def open(self, name: str) -> Any:
        """The runner ``name``, opened now unless it is open already."""
        mod = self._open.get(name)
        if mod is not None:
            return mod
        if name not in self._specs:
            raise KeyError(name)
        if self.resident is not None:
            while len(self._open) >= self.resident:
                self.release(next(iter(self._open)))
        mod = self._open[name] = self._open_module(name)
        self.opens += 1
        self.events.append(("open", name))
        self.peak_live = max(self.peak_live, len(self._open))
        return mod

    def get(self, name: str) -> Any:
        """Same as :meth:`open` (the pipeline backends' spelling)."""
        return self.open(name)

    def release(self, name: str) -> None:
        """Drop the open runner (an ncnn.Net and its weights go with the last reference)."""
        if self._open.pop(name, None) is not None:
            self.events.append(("release", name))

    def release_all(self, pred: Callable[[str], bool] = lambda name: True) -> None:
        """Release every open runner (or those whose name satisfies ``pred``)."""
        for name in [n for n in self._open if pred(n)]:
            self.release(name)

    # --- Mapping ---------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        return self.open(name)

    def __contains__(self, name: object) -> bool:   # without opening (Mapping's default would)
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    # --- what was resident -----------------------------------------------------------------------
    @property
    def live(self) -> list[str]:
        """Names of the runners open right now."""
        return list(self._open)

    def live_peak(self, pred: Callable[[str], bool]) -> int:
        """Most runners satisfying ``pred`` that were open at the same time."""
        live, peak = set(), 0
        for kind, name in self.events:
            if not pred(name):
                continue
            (live.add if kind == "open" else live.discard)(name)
            peak = max(peak, len(live))
        return peak

    def opened(self, pred: Callable[[str], bool]) -> int:
        """How many opens so far were of runners satisfying ``pred``."""
        return sum(1 for kind, name in self.events if kind == "open" and pred(name))


def _ncnn_module(reader: PackageReader, name: str, options: RuntimeOptions) -> Any:
    """One graph of a checked package as an ``NcnnModule`` (its own Net and options)."""
    from ncnnport.runtime.session import NcnnModule

    return NcnnModule(reader.param(name), reader.bin(name), reader.specs[name], options)


def open_ncnn_modules(package: Path, names: Sequence[str] | None = None,
                      options: RuntimeOptions = FP32) -> dict[str, Any]:
    """Every graph of a package (or ``names``) opened now, one ``NcnnModule`` each."""
    reader = open_package(package)
    return {n: _ncnn_module(reader, n, options) for n in reader.select(names)}


class LazyModules(Runners):
    """:class:`Runners` of a package's graphs: ``NcnnModule``s under ``options``, the package
    checked against its manifest once (never per open)."""

    def __init__(self, package: Path, options: RuntimeOptions = FP32,
                 names: Sequence[str] | None = None, *, resident: int | None = None,
                 _reader: PackageReader | None = None) -> None:
        self.package = Path(package)
        self.options = options
        self._reader = _reader if _reader is not None else open_package(self.package)
        super().__init__(self._reader.select(names), resident=resident)

    def _open_module(self, name: str) -> Any:
        return _ncnn_module(self._reader, name, self.options)

    def spec(self, name: str) -> Mapping[str, Any]:
        return self._specs[name]

    def with_options(self, options: RuntimeOptions) -> "LazyModules":
        """The same package under other runtime options (nothing opened, no re-validation)."""
        return LazyModules(self.package, options, list(self._specs), resident=self.resident,
                           _reader=self._reader)


class LazyTorchModules(Runners):
    """:class:`Runners` of a model's torch side: a ``TorchModule`` over each spec's wrapper,
    built on first use. Why: at real size every ``build()`` reads its module's weights, so building
    all wrappers up front holds a second copy of the whole model next to the ncnn one; parity
    walks the specs one pair at a time instead."""

    def __init__(self, specs: Sequence[Any], resident: int | None = None) -> None:
        super().__init__({s.name: s for s in specs}, resident=resident)

    def _open_module(self, name: str) -> Any:
        from ncnnport.runtime.session import TorchModule

        spec = self._specs[name]
        return TorchModule(spec.build(), spec.to_json())
