"""The model kit: a :class:`~ncnnport.registry.ModelPort` whose ``load`` and plumbing come from
small declared hooks, so a model folder writes only what is its own.

Why here (``ncnnport.models.kit``) and not in ``ncnnport/``: the kit is what model folders build
on, never what a generic stage reads; stages keep talking to the ``ModelPort`` contract only.
Why: every port repeated the same load sequence in its own dialect (config folder -> config ->
keep K layers -> seeded or checkpoint weights -> assets), four ``truncated_config`` functions and
25 lines of bench forwarding each. A port now declares:

* ``config_folder(preset, ckpt)`` and ``read_config(folder)``: the config of a preset or checkpoint;
* ``layer_stacks``: the layer counts ``--layers K`` cuts (:func:`truncate`);
* ``seeded_presets`` / ``seed`` and ``seeded(config, seed)``: weights generated per tensor;
* ``from_folder(folder, config, truncated)``: weights read per module from a checkpoint;
* ``assets(folder)`` / ``extra(folder, reference)``: files and objects the runtime needs;
* ``specs_module`` / ``bench_module``: the folder's modules holding ``module_specs`` (each spec
  declaring its ``weights``), ``module_weight_bytes``, optionally ``weight_source(reference)`` and
  ``unused_weights(reference)`` (stored tensors no graph reads, with why), and the bench tables (``STAGES``, ``PERF_STAGES``, ``ncnn_call``, ``torch_call``, ``stage_bytes``).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ncnnport.registry import LoadedModel, ModelPort


@dataclass(frozen=True)
class LayerStack:
    """One stack ``--layers K`` cuts: the dotted path of its layer count in the config, lists
    holding one entry per layer (cut to K too), and how an error names it."""

    count: str
    label: str
    per_layer: tuple[str, ...] = ()


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _set(obj: Any, path: str, value: Any) -> Any:
    """A copy of ``obj`` with ``path`` set: frozen dataclasses through ``replace``, any other
    object through a shallow copy and ``setattr`` (transformers configs validate the whole object
    on construction, so a layer count and its per-layer list cannot go through ``replace`` one
    at a time). The caller's config is untouched."""
    head, _, rest = path.partition(".")
    new = value if not rest else _set(getattr(obj, head), rest, value)
    if dataclasses.is_dataclass(obj) and obj.__dataclass_params__.frozen:
        return dataclasses.replace(obj, **{head: new})
    out = copy.copy(obj)
    setattr(out, head, new)
    return out


def truncate(config: Any, stacks: tuple[LayerStack, ...], layers: int | None, model: str) -> Any:
    """``config`` keeping the first ``layers`` layers of every stack (None: ``config`` itself).
    A count outside 1..(smallest stack) is a one-line ValueError naming every stack."""
    if layers is None:
        return config
    counts = {s.label: int(_get(config, s.count)) for s in stacks}
    if not 1 <= layers <= min(counts.values()):
        have = ", ".join(f"{n} {label}" for label, n in counts.items())
        raise ValueError(f"--layers {layers}: {model} has {have} (use 1..{min(counts.values())})")
    for s in stacks:
        config = _set(config, s.count, layers)
        for path in s.per_layer:
            values = _get(config, path)
            if values:
                config = _set(config, path, list(values)[:layers])
    return config


class KitPort(ModelPort):
    """``load``, the split and the bench hooks from declared parts (see the module docstring)."""

    supports_layers = True
    seeded_presets: tuple[str, ...] = ("real",)
    seed: int = 0
    layer_stacks: tuple[LayerStack, ...] = ()
    specs_module: str = "specs"
    bench_module: str = "bench"

    # --- declared hooks ------------------------------------------------------------------------
    def config_folder(self, preset: str, ckpt: Path | None) -> Path | None:
        """Where the config (and assets) of ``preset`` / ``ckpt`` live; None: no folder."""
        return Path(ckpt) if ckpt is not None else None

    def read_config(self, folder: Path | None, preset: str) -> Any:
        raise NotImplementedError(f"model {self.name}: read_config")

    def seeded(self, config: Any, seed: int) -> Any:
        """The reference with seeded per-tensor weights (a ``seeded_presets`` preset)."""
        raise NotImplementedError(f"model {self.name}: no seeded weights")

    def from_folder(self, folder: Path, config: Any, truncated: bool) -> Any:
        """The reference reading its weights from ``folder`` per module (strict when whole)."""
        raise NotImplementedError(f"model {self.name}: no checkpoint loader")

    def assets(self, folder: Path | None) -> dict[str, Path]:
        return {}

    def extra(self, folder: Path | None, reference: Any) -> dict[str, Any]:
        return {}

    def config_json(self, reference: Any) -> dict[str, Any]:
        """The JSON-able config identifying the architecture (hashed into the build key)."""
        return reference.config.to_json()

    # --- load from the hooks -------------------------------------------------------------------
    def truncate(self, config: Any, layers: int | None) -> Any:
        return truncate(config, self.layer_stacks, layers, f"the {self.name} model")

    def reference(self, preset: str, ckpt: Path | None, folder: Path | None, config: Any,
                  layers: int | None) -> Any:
        """Seeded for a seeded preset without a checkpoint, else read from ``folder``."""
        if ckpt is None and preset in self.seeded_presets:
            return self.seeded(config, self.seed)
        return self.from_folder(folder, config, truncated=layers is not None)

    def load(self, preset: str, ckpt: Path | None, layers: int | None = None) -> LoadedModel:
        """The reference of ``preset`` (or ``ckpt``) with its first ``layers`` layers, weights
        read or generated one module at a time (see each model's lazy.py)."""
        folder = self.config_folder(preset, ckpt)
        config = self.truncate(self.read_config(folder, preset), layers)
        ref = self.reference(preset, ckpt, folder, config, layers)
        return LoadedModel(self.name, preset, ckpt, config=self.config_json(ref), reference=ref,
                           assets=self.assets(folder), extra={**self.extra(folder, ref), "layers": layers})

    # --- the split and the bench, from the folder's modules ------------------------------------
    def _own(self, module: str) -> Any:
        return importlib.import_module(f"{type(self).__module__.rsplit('.', 1)[0]}.{module}")

    def module_specs(self, loaded: LoadedModel) -> list:
        """The specs module's split, its declared weights checked against the loaded source and
        recorded on each spec (:func:`ncnnport.export.weights.bind_weights`)."""
        from ncnnport.export.weights import bind_weights

        specs = self._own(self.specs_module).module_specs(loaded.reference)
        bind_weights(specs, self.weight_source(loaded), self.unused_weights(loaded))
        return specs

    def weight_source(self, loaded: LoadedModel) -> Any:
        """The specs module's ``weight_source(reference)``, else the reference's ``source``."""
        fn = getattr(self._own(self.specs_module), "weight_source", None)
        return fn(loaded.reference) if fn is not None else loaded.reference.source

    def unused_weights(self, loaded: LoadedModel) -> dict[str, str]:
        """Stored tensors no graph reads, pattern -> why (the specs module's ``unused_weights``)."""
        fn = getattr(self._own(self.specs_module), "unused_weights", None)
        return dict(fn(loaded.reference)) if fn is not None else {}

    def module_weight_bytes(self, loaded: LoadedModel) -> dict[str, int]:
        return self._own(self.specs_module).module_weight_bytes(loaded.reference)

    def bench_stages(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self._own(self.bench_module).STAGES.items()}

    def bench_perf_stages(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in getattr(self._own(self.bench_module), "PERF_STAGES",
                                                self.bench_stages()).items()}

    def bench_call(self, loaded: LoadedModel, modules: Mapping[str, Any], stage: str, size: str) -> Any:
        return self._own(self.bench_module).ncnn_call(loaded.reference, modules, stage, size)

    def torch_bench_call(self, loaded: LoadedModel, stage: str, size: str, device: str = "cpu") -> Any:
        """The bench module's ``torch_call``; a torch device other than the CPU is passed on only
        to bench modules whose ``torch_call`` takes one (``bench --torch-device``)."""
        import inspect

        call = getattr(self._own(self.bench_module), "torch_call", None)
        if call is None:
            return None
        if device == "cpu":
            return call(loaded.reference, stage, size)
        if "device" not in inspect.signature(call).parameters:
            raise ValueError(f"{self.name}: its torch bench runs on the CPU only (no --torch-device {device})")
        return call(loaded.reference, stage, size, device=device)

    def bench_unmatched(self, stage: str) -> str | None:
        """The bench module's ``UNMATCHED_OUTPUTS[stage]`` (why its torch and ncnn calls differ)."""
        return getattr(self._own(self.bench_module), "UNMATCHED_OUTPUTS", {}).get(stage)

    def bench_peer_graphs(self, loaded: LoadedModel, stage: str, size: str) -> list[tuple[str, dict[str, int]]] | None:
        """The bench module's ``peer_graphs(reference, stage, size)`` (None when it has none)."""
        fn = getattr(self._own(self.bench_module), "peer_graphs", None)
        return None if fn is None else fn(loaded.reference, stage, size)

    def bench_perf_targets(self) -> list[Any]:
        """The bench module's ``PERF_TARGETS``."""
        return list(getattr(self._own(self.bench_module), "PERF_TARGETS", ()))

    def bench_token_stage(self) -> str | None:
        """The bench module's ``TOKEN_STAGE`` (None when it has none)."""
        return getattr(self._own(self.bench_module), "TOKEN_STAGE", None)

    def bench_bytes(self, loaded: LoadedModel, stage: str, size: str,
                    precision: str = "fp32") -> dict[str, int] | None:
        """The bench module's ``stage_bytes(reference, stage, size, precision)`` (a Precision)."""
        from ncnnport.runtime.precision import get

        fn = getattr(self._own(self.bench_module), "stage_bytes", None)
        return None if fn is None else fn(loaded.reference, stage, size, get(precision))
