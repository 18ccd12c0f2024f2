"""Model registry: each model folder registers one :class:`ModelPort` under its CLI name.

Generic stages (export, convert, parity, reports) look models up here and talk to them only
through these hooks, so adding a model never edits a generic stage.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from ncnnport.contract import ModuleSpec

# CLI name -> module path of the model folder; imported lazily (torch/transformers are heavy).
KNOWN_MODELS: dict[str, str] = {
    "qwen3-asr": "ncnnport.models.qwen3_asr.port",
    "youtu-vl": "ncnnport.models.youtu_vl.port",
    "seedvr2": "ncnnport.models.seedvr2.port",
}


@dataclass
class LoadedModel:
    """A model ready to export: the torch reference plus everything the runtime needs.

    ``source`` is ``preset:<name>`` or the checkpoint folder; ``config`` is a JSON-able dict that
    identifies the architecture (hashed into the manifest); ``assets`` are files the runtime
    needs beside the graphs (tokenizer, processor config), copied into the package by export.
    """

    name: str
    preset: str
    ckpt: Path | None
    config: dict[str, Any]
    reference: Any
    assets: dict[str, Path] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class E2EContext:
    """What the generic parity stage hands a model's end-to-end check."""

    loaded: LoadedModel
    ncnn_modules: Mapping[str, Any]   # name -> NcnnModule (ModuleRunner)
    torch_modules: Mapping[str, Any]  # name -> TorchModule over the same wrappers
    package_dir: Path
    policy: Any = None                # ncnnport.parity.policy.Policy
    user_inputs: Sequence[Path] = ()
    precision: str = "fp32"


@dataclass
class CppCase:
    """One input for ``parity --runtime cpp``: the model's C++ executable's arguments for it and
    the token ids (per chunk / per generated sequence) the same input gives on the torch-free
    Python package loop and on the torch reference. The executable writes ``--json-out FILE``
    with ``{"chunks": [{"token_ids": [...]}, ...]}``; the driver adds that option.

    A model that outputs frames instead sets ``python_frames`` (uint8 (T, H, W, C) of the Python
    package loop), optionally ``reference_frames`` (the torch reference's), and ``frames_gate``
    (the policy's frames Tolerance); its executable's JSON lists ``frames: [{"path": PNG}, ...]``
    and ``frames_sha256``. The token fields stay empty then."""

    fixture: str
    argv: list[str]
    python_tokens: list[list[int]]
    reference_tokens: list[list[int]]
    reference_logits: list[list[Any]] | None = None  # per chunk, the reference's logits per step
    python_text: str | None = None
    python_frames: Any = None      # np.ndarray uint8 (T, H, W, C); None for a token model
    reference_frames: Any = None
    frames_gate: Any = None        # contract.Tolerance over image rows (levels 0..255)


@dataclass
class CaseRun:
    """What one packaged case computed on a package's own torch-free loop (``ModelPort.run_case``).

    ``expected`` has the schema of the case's ``expected`` (token ids, frame sha256 and
    statistics), so a derived package (fp16 or int8 weights) can pin it as its case's expected
    values; ``files`` are the case-folder files that belong to those values (SeedVR2's
    ``expected.png``); ``output`` is the run's raw output for the comparison only (never written)."""

    expected: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)
    output: Any = None


CPP_BENCH_KINDS = ("decode", "image")


@dataclass
class CppBenchCase:
    """One workload of ``bench-cpp`` (ncnnport/drivers/cpp_bench.py): the row's ``label``, the C++
    executable's arguments (all but ``--json-out``; the driver runs it once per round and parses
    its JSON by ``kind``), and zero-argument callables running the same workload once on the
    torch-free Python package loop and on the torch reference (None: no torch column).

    ``kind`` "decode": the callables return ``models.bench_kit.DecodeRun`` and the executable's
    JSON has one chunk plus ``timing.decode_s / decode_steps / decode_graph_s``. ``kind`` "image":
    they return ``bench_kit.ImageRun`` and the JSON has ``seconds.total`` (less
    ``seconds.load_graphs``) and ``frames``. ``info`` is merged into the row; ``fresh_dir`` is a
    folder the executable writes into and wants new or empty, emptied before every C++ run.
    In round one the Python loop runs first: a torch callable may reuse what it computed.
    ``python_logits_at`` (decode, optional): the Python loop's logits at the step that chose
    token k, from an untimed run after the rounds; where the C++ and Python ids part, each flip is
    reported with the Python loop's top-2 margin there. ``logits_stage``: the policy stage whose
    gate holds the pipeline's logits (its propagated budget judges such a flip in a precision whose
    policy judges tokens teacher-forced: ncnnport/drivers/cpp_bench.py ``ids_gate``)."""

    label: str
    kind: str
    argv: list[str]
    python: Callable[[], Any]
    torch: Callable[[], Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    fresh_dir: Path | None = None
    python_logits_at: Callable[[int], Any] | None = None
    logits_stage: str = "logits"

    def __post_init__(self) -> None:
        if self.kind not in CPP_BENCH_KINDS:
            raise ValueError(f"CppBenchCase {self.label}: kind {self.kind!r} is not one of "
                             f"{', '.join(CPP_BENCH_KINDS)}")


class ModelPort(ABC):
    """Hooks a model folder implements. Each returns data; stages write files and run tools."""

    name: str = ""
    presets: tuple[str, ...] = ("tiny",)
    # True when ``load`` accepts ``layers=K`` (keep the first K layers of every stack; the
    # ``--layers`` option). Ports without it refuse the option instead of ignoring it.
    supports_layers: bool = False

    @property
    def policy_path(self) -> Path:
        """The model's tolerance policy file (``policy.json`` in its folder)."""
        return Path(importlib.import_module(type(self).__module__).__file__).with_name("policy.json")

    # The stage names its pipeline asks the policy for (``parity.policy.Policy.stage``): the
    # orchestrator loads the policy with them, so a stage the file states or a caller asks for
    # outside them is refused (a misspelling would silently take the mode's default gate). None:
    # undeclared (every name taken), for ports under test only: every registered port declares it.
    policy_stages: tuple[str, ...] | None = None
    # Modules its pipeline runs on the host beside the converted graphs and traces like them
    # (Youtu-VL's tied token embedding, a row lookup into lm_head's weights): with the specs' names
    # they are the module names the policy is loaded with (``Policy.module`` refuses any other).
    host_modules: tuple[str, ...] = ()

    @abstractmethod
    def load(self, preset: str, ckpt: Path | None) -> LoadedModel:
        """Build the torch reference from a preset (seeded) or a local HF-format checkpoint."""

    @abstractmethod
    def module_specs(self, loaded: LoadedModel) -> list[ModuleSpec]:
        """The split: one spec per exported graph."""

    def module_weight_bytes(self, loaded: LoadedModel) -> dict[str, int]:
        """float32 weight bytes per graph (for the memory receipts); empty when unknown."""
        return {}

    @abstractmethod
    def e2e_parity(self, ctx: E2EContext) -> list[dict[str, Any]]:
        """Propagated parity records (schema of summary.json's ``e2e`` entries)."""

    def official_reference(self, ctx: E2EContext) -> list[dict[str, Any]]:
        """Rows comparing the port with the model's official upstream package on the same
        fixtures (``parity --official-ref``): reported, never gated, since where the official code
        and the reference library disagree the port follows one of them with a stated reason."""
        return [{"fixture": "*", "stage": "official_reference", "kind": "official", "skipped": True,
                 "passed": True, "gated": False,
                 "reason": f"{self.name} has no runner for its official package"}]

    def streamed_parity(self, ctx: E2EContext) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Full-depth parity holding one module of each side at a time (``parity --stream``):
        (records, memory/timing receipt). For models too large for reference + package in RAM."""
        raise NotImplementedError(f"model {self.name} has no streamed parity")

    def run(self, loaded: LoadedModel, modules: Mapping[str, Any], args: Any) -> int:
        """The ``run`` verb; models without a CLI runtime say so."""
        raise NotImplementedError(f"model {self.name} has no run command")

    # --- the C++ runtime (``parity --runtime cpp``) ---------------------------------------------
    # The executable's name in the C++ build folder (build/cpp/); None: the model has no C++ loop.
    cpp_executable: str | None = None

    def cpp_cases(self, ctx: E2EContext, workdir: Path, max_new_tokens: int) -> list[CppCase]:
        """The e2e fixtures and ``ctx.user_inputs`` as :class:`CppCase` rows (input files written
        under ``workdir``), each already run on the Python package loop and the torch reference."""
        raise NotImplementedError(f"model {self.name} has no C++ runtime")

    def cpp_package_argv(self, package: Path, case: Any, workdir: Path) -> list[str]:
        """The C++ executable's arguments (all but ``--json-out``) for a packaged case
        (``package.cases.CaseOnDisk``), outputs under ``workdir``; no reference is run. Its result is
        judged against ``case.expected`` (``token_ids``, or ``frames_sha256`` + ``expected.png``)."""
        raise NotImplementedError(f"model {self.name} has no C++ arguments for packaged cases")

    # --- the C++ bench (``bench-cpp``) ----------------------------------------------------------
    # Default sizes of ``bench-cpp`` (prompt tokens, or an image side); empty: the model has no C++
    # bench, and ``bench-cpp`` refuses it before anything is built.
    cpp_bench_sizes: tuple[int, ...] = ()
    # The torch device kinds its bench-cpp torch loop runs on (``--torch-device``; others are
    # refused before anything is built).
    cpp_bench_torch_devices: tuple[str, ...] = ("cpu",)
    # The kind of its bench-cpp cases (``CPP_BENCH_KINDS``), known before anything is built, so an
    # option only one kind's executables take (``--huge-pages``: decode) is refused up front.
    cpp_bench_kind: str = "decode"

    def cpp_bench_cases(self, ctx: Any, sizes: Sequence[int], new_tokens: int) -> Iterator[CppBenchCase]:
        """One :class:`CppBenchCase` per size (what every size shares, e.g. the opened package, is
        built once; a case's inputs are written under ``ctx.workdir``). The driver takes every
        case before the first run, since its rounds interleave the sizes: a case holds its inputs
        and calls, not a size's working memory. ``ctx`` is a ``models.bench_kit.BenchContext``."""
        raise NotImplementedError(f"model {self.name} has no C++ bench")

    # --- the package alone (torch-free; ``ncnnport verify`` and ``run --package``) -------------
    def runtime_description(self, loaded: LoadedModel) -> dict[str, Any] | None:
        """What the package's ``model.json`` holds beside schema and model name (dims, special
        and eos ids, RoPE rules, prompt pieces, generation defaults, preprocessing constants,
        ``files``: role -> package-relative path), read from the reference at convert time;
        None while the model has no torch-free runtime."""
        return None

    def runtime_files(self, loaded: LoadedModel) -> dict[str, bytes]:
        """Files a runtime needs that are not checkpoint assets (package-relative path under
        ``assets/`` -> bytes), e.g. a fixed text embedding; written before ``model.json``."""
        return {}

    def package_cases(self, loaded: LoadedModel) -> list[Any]:
        """End-to-end cases (``package.cases.PackageCase``) with the reference's results, written
        into the package at convert time; >= 2 for a model with a torch-free runtime."""
        return []

    def run_case(self, package: Path, model_json: Mapping[str, Any], case: Any,
                 modules: Mapping[str, Any]) -> CaseRun:
        """Run one packaged case (``package.cases.CaseOnDisk``) on the package's opened graphs
        ``modules``, without torch or transformers, and return its results in the schema of
        ``case.expected`` (what a derived package pins as its own expected values)."""
        raise NotImplementedError(f"model {self.name} has no torch-free runtime")

    def check_case(self, package: Path, model_json: Mapping[str, Any], case: Any,
                   modules: Mapping[str, Any]) -> dict[str, Any]:
        """Run one packaged case (``run_case``) and compare it with ``case.expected``:
        ``{"passed": bool, "detail": str}``."""
        raise NotImplementedError(f"model {self.name} has no torch-free runtime")

    def run_package(self, package: Path, model_json: Mapping[str, Any], modules: Mapping[str, Any],
                    args: Any) -> int:
        """The ``run --package`` verb on the package's opened graphs ``modules``, without torch or
        transformers."""
        raise NotImplementedError(f"model {self.name} cannot run from a package alone yet")

    def add_run_arguments(self, parser: Any) -> None:
        """Model-specific options of the ``run`` verb."""

    def validate_run_args(self, args: Any) -> None:
        """Check the ``run`` verb's model options (input files exist and decode, sizes are in
        range) BEFORE any model is built, so a bad input costs milliseconds, not a model load.
        Raise ``ValueError`` with one line naming the file or option."""

    def validate_inputs(self, paths: Sequence[Path]) -> None:
        """Check ``parity --input`` files before any model is built (same contract as
        ``validate_run_args``)."""

    def bench_stages(self) -> dict[str, list[str]]:
        """Benchmarkable stages and their default sizes (``{"decode": ["16", "512"]}``)."""
        return {}

    def bench_call(self, loaded: LoadedModel, modules: Mapping[str, Any], stage: str,
                   size: str) -> Any:
        """A zero-argument callable running ``stage`` once at ``size`` on ``modules`` with fixed
        inputs (so every call must return identical outputs)."""
        raise NotImplementedError(f"model {self.name} has no bench stage {stage!r}")

    def torch_bench_call(self, loaded: LoadedModel, stage: str, size: str) -> Any:
        """The PyTorch eager equivalent of a bench stage (for the speed ratio), or None. A port
        that also takes ``device: str`` runs it on that torch device (``bench --torch-device``)."""
        return None

    def bench_perf_stages(self) -> dict[str, list[str]]:
        """Stages and sizes of the speed table (``bench --perf``); default: every bench stage."""
        return self.bench_stages()

    def bench_unmatched(self, stage: str) -> str | None:
        """Why ``bench_call`` and ``torch_bench_call`` of ``stage`` return different numbers (the
        same work on different inputs, e.g. a K/V cache filled two ways), so their outputs must not
        be compared; None when they take the same inputs (the device table's parity columns)."""
        return None

    def bench_bytes(self, loaded: LoadedModel, stage: str, size: str,
                    precision: str = "fp32") -> dict[str, int] | None:
        """Bytes one call of a bench stage must read under ``precision`` (``{"weights": ..,
        "kv_cache": ..}``), for the memory-bandwidth bound; None when unknown."""
        return None

    def bench_token_stage(self) -> str | None:
        """The bench stage that is one whole generated token (embedding row, every layer, the
        head): the work a C++ decode step does, so ``bench-cpp`` counts its ``bench_bytes`` for
        the bound. None where the model generates no tokens (no bound in bench-cpp)."""
        return None

    def bench_peer_graphs(self, loaded: LoadedModel, stage: str, size: str) -> list[tuple[str, dict[str, int]]] | None:
        """The graphs (module name, axis sizes) one call of a bench stage runs, for the ONNX
        Runtime peer column of ``bench --perf``; None when the stage declares none."""
        return None

    def bench_perf_targets(self) -> list[Any]:
        """The speed targets ``bench --perf`` judges (``runtime/perf_targets.PerfTarget``)."""
        return []


def model_names() -> list[str]:
    return list(KNOWN_MODELS)


def available_models() -> list[str]:
    """Registered models whose folder exists in this installation."""
    out = []
    for name, mod in KNOWN_MODELS.items():
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name and mod.startswith(exc.name):
                continue
            raise
        out.append(name)
    return out


def get_port(name: str) -> ModelPort:
    if name not in KNOWN_MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(KNOWN_MODELS)}")
    module = importlib.import_module(KNOWN_MODELS[name])
    port = getattr(module, "PORT", None)
    if not isinstance(port, ModelPort):
        raise TypeError(f"{KNOWN_MODELS[name]} must define PORT = <ModelPort instance>")
    return port
