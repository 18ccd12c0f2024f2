"""The staged pipeline: export -> convert -> parity -> report, reusing up-to-date artifacts.

Everything here is generic: a model is reached only through its ``ModelPort`` hooks and the
module specs they return.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ncnnport.contract import ModuleSpec
from ncnnport.package.manifest import check_package, tool_versions, write_manifest
from ncnnport.convert.pnnx_runner import convert_module
from ncnnport.export.golden import write_module_golden
from ncnnport.export.tracing import export_module
from ncnnport.package.cases import write_case
from ncnnport.package.golden import golden_path
from ncnnport.package.model_json import write_model_json
from ncnnport.fsutil import build_lock, read_json, sha256_file, sha256_json, write_json
from ncnnport.parity.policy import Policy
from ncnnport.registry import LoadedModel, ModelPort, get_port
from ncnnport.targets import Target, checkpoint_fingerprint, code_file_hashes, code_hash


def log(msg: str) -> None:
    print(f"[ncnnport] {msg}", file=sys.stderr, flush=True)


@dataclass
class Prepared:
    """A loaded model with its specs (tolerances filled from the policy) and build key."""

    target: Target
    port: ModelPort
    loaded: LoadedModel
    policy: Policy
    specs: list[ModuleSpec]
    build_key: str
    config_hash: str
    timings: dict[str, float] = field(default_factory=dict)
    # what the build key was computed from, finer grained (per code file, per module spec), kept in
    # state.json so that a rebuild can say which file or key changed
    key_parts: dict[str, Any] = field(default_factory=dict)

    def spec(self, name: str) -> ModuleSpec:
        for s in self.specs:
            if s.name == name:
                return s
        raise KeyError(name)


def prepare(target: Target) -> Prepared:
    """Load the target's model and split it. Each spec records its fp32 gates (part of the build
    key); a reduced precision is judged by ``Policy.module(name, mode)`` at parity time, so the
    package does not change with the precision it is run in."""
    port = get_port(target.model)
    if target.ckpt is None and target.preset not in port.presets:
        raise ValueError(f"model {target.model}: unknown preset {target.preset!r}; "
                         f"available: {', '.join(port.presets)}")
    if target.ckpt is not None and not Path(target.ckpt).is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {target.ckpt}")
    t0 = time.perf_counter()
    ckpt = Path(target.ckpt) if target.ckpt else None
    if target.layers is not None:
        if not port.supports_layers:
            raise ValueError(f"model {target.model} does not support --layers")
        loaded = port.load(target.preset, ckpt, layers=target.layers)
    else:
        loaded = port.load(target.preset, ckpt)
    specs = port.module_specs(loaded)
    policy = Policy.load(port.policy_path, stages=port.policy_stages,
                         modules=[*(s.name for s in specs), *port.host_modules])
    for s in specs:
        if not s.tolerances:
            s.tolerances = policy.module(s.name, "fp32")
    config_hash = sha256_json(loaded.config)
    key = sha256_json({
        "config": config_hash, "code": code_hash(target.model), "ckpt": checkpoint_fingerprint(target.ckpt),
        "preset": target.preset, "specs": [s.to_json() for s in specs], "versions": tool_versions(),
        **({"layers": target.layers} if target.layers is not None else {}),
    })
    parts = {"config": config_hash, "code": code_file_hashes(target.model),
             "ckpt": checkpoint_fingerprint(target.ckpt), "preset": target.preset,
             "specs": {s.name: sha256_json(s.to_json()) for s in specs}, "versions": tool_versions(),
             "layers": target.layers}
    return Prepared(target, port, loaded, policy, specs, key, config_hash,
                    {"load_s": time.perf_counter() - t0}, key_parts=parts)


def _short(v: Any) -> str:
    """A hash shortened to 12 hex digits; other values as they are."""
    text = str(v)
    return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text


def key_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One line per build-key input that differs between two ``key_parts`` records: the file,
    module or key, with its old and new value (hashes shortened)."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            for sub in sorted(set(a) | set(b)):
                if a.get(sub) != b.get(sub):
                    out.append(f"{key} {sub}: {_short(a.get(sub, 'absent'))} -> {_short(b.get(sub, 'absent'))}")
        else:
            out.append(f"{key}: {_short(a if key in old else 'absent')} -> {_short(b if key in new else 'absent')}")
    return out


def rebuild_reasons(state: dict[str, Any], stage_key: str, prep: "Prepared", force: bool,
                    problems: Sequence[str] = ()) -> list[str]:
    """Why ``stage_key`` (exported / converted...) must be redone, one line each: ``--force``, no
    earlier build, the build-key inputs that changed, or the package's own problems."""
    if force:
        return ["--force was given"]
    old_key = state.get(stage_key)
    if old_key is None:
        return [f"no earlier {stage_key} build recorded in {prep.target.state_file}"]
    if old_key != prep.build_key:
        old_parts = state.get("key_parts", {}).get(stage_key)
        if old_parts is None:
            return [f"build key {_short(old_key)} -> {_short(prep.build_key)} "
                    "(the earlier build recorded no key inputs to name the change)"]
        return key_changes(old_parts, prep.key_parts) or [
            f"build key {_short(old_key)} -> {_short(prep.build_key)}"]
    return [f"package: {p}" for p in problems]


def _record_stage(target: Target, stage_keys: Sequence[str], prep: "Prepared") -> None:
    """Mark ``stage_keys`` done with this build key in state.json, with the key's inputs."""
    state = _state(target)
    parts = dict(state.get("key_parts", {}))
    for k in stage_keys:
        state[k] = prep.build_key
        parts[k] = prep.key_parts
    write_json(target.state_file, {**state, "key_parts": parts})


def _state(target: Target) -> dict[str, Any]:
    return read_json(target.state_file) if target.state_file.is_file() else {}


def _is_temp(rel: str) -> bool:
    """Temp files of the atomic writers (``.<name>.<random>.tmp``, ``.<name>.tmp<pid>``)."""
    name = rel.rsplit("/", 1)[-1]
    return name.startswith(".") and ".tmp" in name


def trace_file_is_ours(rel: str) -> bool:
    """Files the export stage writes into ``torchscript/``."""
    return "/" not in rel and (rel.endswith((".pt", ".spec.json")) or rel == "progress.json" or _is_temp(rel))


def package_file_is_ours(rel: str) -> bool:
    """Files the convert stage writes into a package folder (``ncnn/``, ``specs/``, ``assets/``,
    ``golden/``, ``cases/``, ``model.json``, ``policy.json``, the manifest, the progress record)."""
    top = rel.split("/", 1)[0]
    return (top in ("ncnn", "specs", "assets", "golden", "cases") and "/" in rel) or rel in (
        "manifest.json", "model.json", "policy.json", ".progress.json") or _is_temp(rel)


def refuse_foreign_files(folder: Path, is_ours: Any) -> None:
    """Raise, naming them, if ``folder`` holds files (or links) that ``is_ours`` (on the relative
    path) does not recognise as written by ncnnport."""
    if not folder.exists():
        return
    foreign = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                     if (p.is_file() or p.is_symlink()) and not is_ours(p.relative_to(folder).as_posix()))
    if foreign:
        shown = ", ".join(repr(f) for f in foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ValueError(f"{folder}: refusing to delete it for a rebuild: it holds files ncnnport did not "
                         f"write ({shown}); move them elsewhere")


def remove_owned_tree(folder: Path, is_ours: Any) -> None:
    """Delete ``folder`` only if every file in it is one ncnnport writes there; otherwise refuse,
    naming the foreign files: a user's file is never lost to a rebuild."""
    refuse_foreign_files(folder, is_ours)
    if folder.exists():
        shutil.rmtree(folder)


def _manifest_files(pkg: Path) -> set[str] | None:
    """Relative paths the package's manifest lists (None when there is no readable manifest)."""
    try:
        files = read_json(pkg / "manifest.json")["files"]
        return set(files) if isinstance(files, dict) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def package_owner_check(pkg: Path) -> Any:
    """Which files of an existing package ncnnport wrote: those its manifest lists (or, without a
    readable manifest, the files of the package layout)."""
    listed = _manifest_files(pkg)
    if listed is None:
        return package_file_is_ours
    return lambda rel: rel in listed or rel in ("manifest.json", ".progress.json") or _is_temp(rel)


def remove_package(pkg: Path) -> None:
    """Delete an old package before the new one is renamed into place (only files it wrote)."""
    remove_owned_tree(pkg, package_owner_check(pkg))


class Progress:
    """Progress of a per-module stage: elapsed time and an ETA after every finished module.

    On a terminal it is a rich progress bar (modules done, elapsed, ETA) with each module's line
    printed above it; elsewhere (CI logs, pipes) one plain stderr line per module, as before.
    The ETA weighs each remaining module by its weight bytes plus a fixed start-up cost (pnnx
    start-up and tracing dominate small modules, weight I/O large ones) and scales by the time
    the modules finished in THIS run took (resumed modules cost nothing and count for nothing);
    rich's own rate estimate would count modules, not bytes. Use as a context manager so the
    bar is closed when the stage ends or fails.
    """

    OVERHEAD_BYTES = 32 << 20

    def __init__(self, model: str, stage: str, names: Sequence[str], weight_bytes: dict[str, int],
                 console: Any = None) -> None:
        self.model, self.stage, self.names = model, stage, list(names)
        self.cost = {n: weight_bytes.get(n, 0) + self.OVERHEAD_BYTES for n in self.names}
        self.t0 = time.perf_counter()
        self.done_cost = 0
        self.remaining = sum(self.cost.values())
        self._console = console
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> "Progress":
        from rich.console import Console

        console = self._console or Console(stderr=True)
        if console.is_terminal:
            self._bar = _rich_bar(console)
            self._task = self._bar.add_task(f"{self.model}: {self.stage}", total=len(self.names), eta="-")
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def eta_seconds(self) -> float:
        """Seconds left: this run's time per unit of cost times the cost still to do."""
        elapsed = time.perf_counter() - self.t0
        return elapsed * self.remaining / self.done_cost if self.done_cost else 0.0

    def skip(self, name: str) -> None:
        self.remaining -= self.cost[name]
        if self._bar is not None:
            self._bar.advance(self._task)

    def finish(self, index: int, name: str, seconds: float, extra: str = "") -> None:
        self.done_cost += self.cost[name]
        self.remaining -= self.cost[name]
        elapsed, eta = time.perf_counter() - self.t0, self.eta_seconds()
        line = (f"{self.model}: {self.stage} [{index}/{len(self.names)}] {name} {seconds:.1f} s{extra} "
                f"(elapsed {_hms(elapsed)}, ETA {_hms(eta)})")
        if self._bar is None:
            log(line)
            return
        self._bar.console.print(f"[ncnnport] {line}", markup=False, highlight=False)
        self._bar.update(self._task, completed=index, eta=_hms(eta))


def _rich_bar(console: Any) -> Any:
    """A rich progress bar: description, bar, modules done, elapsed, the byte-weighted ETA."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    return RichProgress(TextColumn("[ncnnport] {task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"),
                        console=console, transient=False)


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _weight_bytes(prep: Prepared) -> dict[str, int]:
    try:
        return dict(prep.port.module_weight_bytes(prep.loaded))
    except Exception:  # noqa: BLE001 - sizes only steer the ETA and the memory receipt
        return {}


def _resume_state(path: Path, key: Any) -> dict[str, Any]:
    """The progress record at ``path`` if it belongs to ``key`` (else empty: start afresh)."""
    if path.is_file():
        try:
            rec = read_json(path)
        except ValueError:
            return {}
        if rec.get("key") == key:
            return rec
    return {}


def export_stage(prep: Prepared, force: bool = False) -> list[dict[str, Any]]:
    """Trace every spec, one module in memory at a time, resumably.

    Each finished module is recorded in ``torchscript/progress.json`` (after its ``.pt`` and spec
    JSON were written atomically); an interrupted run continues with the first unfinished
    module. Peak RSS is measured per module (VmHWM reset before each) and for the stage. The
    build folder is locked for the duration (one process per build folder).
    """
    with build_lock(prep.target.root):
        return _export_locked(prep, force)


def _export_locked(prep: Prepared, force: bool) -> list[dict[str, Any]]:
    from ncnnport.memory import mb, peak_rss_bytes, release_memory, reset_peak_rss, rss_bytes

    t = prep.target
    state = _state(t)
    if not force and state.get("exported") == prep.build_key and all(
            (t.torchscript_dir / f"{s.name}.pt").is_file() for s in prep.specs):
        log(f"{t.model}: export up to date ({len(prep.specs)} modules)")
        return [read_json(t.torchscript_dir / f"{s.name}.spec.json") for s in prep.specs]
    for reason in rebuild_reasons(state, "exported", prep, force, ["a TorchScript file is missing"]):
        log(f"{t.model}: exporting: {reason}")
    progress_file = t.torchscript_dir / "progress.json"
    resume = {} if force else _resume_state(progress_file, prep.build_key)
    done: dict[str, dict[str, Any]] = {
        n: m for n, m in resume.get("done", {}).items()
        if (t.torchscript_dir / f"{n}.pt").is_file() and (t.torchscript_dir / f"{n}.spec.json").is_file()}
    if not resume and t.torchscript_dir.exists():
        remove_owned_tree(t.torchscript_dir, trace_file_is_ours)
    elif done:
        log(f"{t.model}: export resumes: {len(done)}/{len(prep.specs)} modules already done")
    t.torchscript_dir.mkdir(parents=True, exist_ok=True)
    sizes = _weight_bytes(prep)
    records = []
    t0 = time.perf_counter()
    release_memory()
    baseline = mb(rss_bytes())
    reset_peak_rss()
    with Progress(t.model, "export", [s.name for s in prep.specs], sizes) as progress:
        for i, spec in enumerate(prep.specs, 1):
            if spec.name in done:
                progress.skip(spec.name)
                records.append(read_json(t.torchscript_dir / f"{spec.name}.spec.json"))
                continue
            m0 = time.perf_counter()
            reset_peak_rss()
            records.append(export_module(spec, t.torchscript_dir))
            peak = peak_rss_bytes()
            release_memory()
            done[spec.name] = {"seconds": round(time.perf_counter() - m0, 2), "peak_rss_mb": mb(peak),
                               "weight_bytes": sizes.get(spec.name)}
            write_json(progress_file, {"key": prep.build_key, "done": done, "baseline_rss_mb": baseline})
            progress.finish(i, spec.name, time.perf_counter() - m0, f", peak RSS {mb(peak):.0f} MB")
    prep.timings["export_s"] = time.perf_counter() - t0
    state = {k: v for k, v in _state(t).items() if k not in ("converted", "converted_fp16w")}
    write_json(t.state_file, state)  # conversions of older exports are stale
    _record_stage(t, ["exported"], prep)
    return records


def memory_receipt(per_module: dict[str, dict[str, Any]], weight_bytes: dict[str, int],
                   baseline_mb: float | None = None) -> dict[str, Any]:
    """Stage memory numbers for the manifest: peak RSS (max over modules) vs the largest module's
    weight bytes, raw and above ``baseline_mb`` (the process before its first module: interpreter,
    torch, the parameter-free skeleton)."""
    peaks = {n: m["peak_rss_mb"] for n, m in per_module.items() if m.get("peak_rss_mb") is not None}
    largest = max(weight_bytes.items(), key=lambda kv: kv[1]) if weight_bytes else (None, 0)
    out: dict[str, Any] = {"peak_rss_mb": max(peaks.values()) if peaks else None,
                           "peak_module": max(peaks, key=peaks.get) if peaks else None,
                           "largest_module": largest[0], "largest_module_mb": round(largest[1] / 2**20, 1)}
    if baseline_mb is not None:
        out["baseline_rss_mb"] = baseline_mb
    if peaks and largest[1]:
        out["peak_over_largest"] = round(max(peaks.values()) * 2**20 / largest[1], 3)
        if baseline_mb is not None:
            out["peak_above_baseline_over_largest"] = round(
                (max(peaks.values()) - baseline_mb) * 2**20 / largest[1], 3)
    return out


def _copy_assets(loaded: LoadedModel, dest: Path) -> None:
    for name, src in loaded.assets.items():
        target = dest / name
        if Path(src).is_dir():
            shutil.copytree(src, target, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.pt", "__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)


def write_runtime_files(prep: Prepared, dest: Path, weight_bytes: int = 0, precision: str = "fp32") -> None:
    """``model.json`` (with ``precision``: the package's weights), runtime files and the e2e
    cases of a model with a package description (its port's ``runtime_description``,
    ``runtime_files`` and ``package_cases``), computed from the reference; nothing for a model
    without one.

    The cases run the whole reference (transformers generate, the torch VAE and DiT): above
    ``STREAM_TRACES_ABOVE`` bytes of weights, where convert streams one module at a time so as
    never to hold the model, they are left out and a line says so (``verify`` then has no e2e
    rows; the golden vectors still cover every graph)."""
    # The tolerance policy travels with the package, so `verify` on a device judges each backend
    # and precision by the same budgets as parity (Vulkan rows by the Vulkan modes).
    policy = getattr(prep.port, "policy_path", None)  # ports not built on ModelPort have none
    if policy is not None and Path(policy).is_file():
        shutil.copyfile(policy, dest / "policy.json")
    description = prep.port.runtime_description(prep.loaded)
    if description is None:
        return
    for rel, data in prep.port.runtime_files(prep.loaded).items():
        if not rel.startswith("assets/") or ".." in rel.split("/"):
            raise ValueError(f"{prep.target.model}: runtime file {rel!r} must lie under assets/")
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)
    write_model_json(dest, prep.target.model, description, precision=precision)
    if weight_bytes > STREAM_TRACES_ABOVE:
        log(f"{prep.target.model}: package e2e cases left out: computing them holds the whole reference "
            f"({weight_bytes / 2**30:.1f} GiB of weights, above the {STREAM_TRACES_ABOVE / 2**30:.0f} GiB streaming limit)")
        return
    for case in prep.port.package_cases(prep.loaded):
        write_case(dest, case)


# Above this many float32 weight bytes, convert traces one module at a time and deletes each trace
# after converting it (the real Youtu-VL would otherwise keep 20 GB of TorchScript next to 20 GB
# of ncnn weights); `ncnnport export` still writes every trace.
STREAM_TRACES_ABOVE = 4 << 30


def convert_stage(prep: Prepared, force: bool = False, fp16_weights: bool = False,
                  keep_traces: bool | None = None) -> Path:
    """Convert every exported module into ``package/`` (``package-fp16w/`` for pnnx fp16 weights,
    an opt-in precision mode measured by the option sweep).

    Resumable: modules go into ``package.partial/``; each finished module (param + bin + spec
    JSON written atomically) is recorded with its receipt in ``package.partial/.progress.json``,
    so an interrupted run converts only what is left. The package appears by one rename at the
    end. Peak RSS of this process (per module and stage) and of each pnnx child go into the
    receipts and ``manifest.json`` (``memory``).

    ``keep_traces`` (default: only below ``STREAM_TRACES_ABOVE`` bytes of weights, or when the
    traces are already up to date): False traces, converts and deletes each module's TorchScript
    in turn, so disk holds the package plus one trace.
    """
    with build_lock(prep.target.root):
        return _convert_locked(prep, force, fp16_weights, keep_traces)


def _receipt_hashes(folder: Path, name: str, receipt: dict[str, Any]) -> dict[str, str]:
    """sha256 of every file a converted module left in ``folder`` (param, bin, spec JSON, golden
    vectors and variant params), keyed by relative path: what a resumed run re-checks."""
    rels = [f"ncnn/{name}.ncnn.param", f"ncnn/{name}.ncnn.bin", f"specs/{name}.spec.json", f"golden/{name}.npz"]
    rels += [f"ncnn/{v['param']}" for v in receipt.get("variants", [])]
    return {rel: sha256_file(folder / rel) for rel in rels}


def _verified_leftovers(folder: Path, done: dict[str, dict[str, Any]], model: str) -> dict[str, dict[str, Any]]:
    """The recorded modules of a partial package whose files still hash as their receipts say;
    a missing or changed file (a disk error, a hand edit, a killed copy) is redone, said in one
    line naming the file with its recorded and present sha256."""
    kept = {}
    for name, receipt in done.items():
        recorded = receipt.get("sha256")
        if not isinstance(recorded, dict) or not recorded:
            log(f"{model}: convert redoes {name}: its receipt records no sha256")
            continue
        bad = None
        for rel, sha in recorded.items():
            path = folder / rel
            now = sha256_file(path) if path.is_file() else "missing"
            if now != sha:
                bad = f"{rel}: receipt sha256 {_short(sha)}, file {_short(now)}"
                break
        if bad:
            log(f"{model}: convert redoes {name}: {bad}")
        else:
            kept[name] = receipt
    return kept


def _convert_locked(prep: Prepared, force: bool, fp16_weights: bool, keep_traces: bool | None) -> Path:
    from ncnnport.memory import mb, peak_rss_bytes, release_memory, reset_peak_rss, rss_bytes

    t = prep.target
    state = _state(t)
    pkg = t.package_dir if not fp16_weights else t.package_dir.with_name("package-fp16w")
    state_key = "converted" if not fp16_weights else "converted_fp16w"
    # an up-to-date package needs no traces: they may have been deleted to free disk (20 GB at
    # real Youtu-VL size), and re-exporting them only to skip the conversion would be waste
    problems: list[str] = []
    if not force and state.get(state_key) == prep.build_key:  # hash the package only when it may be current
        problems = check_package(pkg, expected=[s.name for s in prep.specs]) if pkg.exists() else [f"{pkg} is missing"]
        if not problems:
            log(f"{t.model}: convert up to date ({pkg})")
            return pkg
    for reason in rebuild_reasons(state, state_key, prep, force, problems):
        log(f"{t.model}: converting{' (fp16 weights)' if fp16_weights else ''}: {reason}")
    refuse_foreign_files(pkg, package_owner_check(pkg))  # before hours of work, not after
    sizes = _weight_bytes(prep)
    if keep_traces is None:  # keep small models' traces; stream the ones that would cost GBs of disk
        keep_traces = sum(sizes.values()) < STREAM_TRACES_ABOVE or (
            not force and state.get("exported") == prep.build_key)
    records = export_stage(prep, force=force) if keep_traces else None
    tmp = pkg.with_name(pkg.name + ".partial")
    progress_file = tmp / ".progress.json"
    key = {"build_key": prep.build_key, "fp16_weights": fp16_weights}
    resume = {} if force else _resume_state(progress_file, key)
    done = _verified_leftovers(tmp, resume.get("done", {}), t.model)
    names = [s.name for s in prep.specs]
    if not done and tmp.exists():
        remove_owned_tree(tmp, package_file_is_ours)
    elif done:
        log(f"{t.model}: convert resumes: {len(done)}/{len(names)} modules already done")
    (tmp / "ncnn").mkdir(parents=True, exist_ok=True)
    (tmp / "specs").mkdir(exist_ok=True)
    if not keep_traces:
        log(f"{t.model}: streaming export+convert ({sum(sizes.values()) / 2**30:.1f} GiB of weights): each "
            "module is traced, converted and its trace deleted before the next")
    t0 = time.perf_counter()
    release_memory()
    baseline = resume.get("baseline_rss_mb") or mb(rss_bytes())
    with Progress(t.model, "convert", names, sizes) as progress:
        for i, spec in enumerate(prep.specs, 1):
            name = spec.name
            if name in done:
                progress.skip(name)
                continue
            m0 = time.perf_counter()
            reset_peak_rss()
            export_peak = None
            if records is not None:
                rec = records[i - 1]
            else:  # trace this module now; its export peak is measured on its own
                t.torchscript_dir.mkdir(parents=True, exist_ok=True)
                rec = export_module(spec, t.torchscript_dir)
                export_peak = mb(peak_rss_bytes())
                release_memory()
                reset_peak_rss()
            receipt = convert_module(rec, t.torchscript_dir / rec["torchscript"], tmp / "ncnn",
                                     fp16_weights=fp16_weights)
            write_json(tmp / "specs" / f"{name}.spec.json", rec)
            write_module_golden(spec, t.torchscript_dir / rec["torchscript"], golden_path(tmp, name))
            if records is None:
                (t.torchscript_dir / rec["torchscript"]).unlink(missing_ok=True)
                receipt["export_peak_rss_mb"] = export_peak
            receipt["peak_rss_mb"] = mb(peak_rss_bytes())
            receipt["weight_bytes"] = sizes.get(name)
            receipt["sha256"] = _receipt_hashes(tmp, name, receipt)
            done[name] = receipt
            write_json(progress_file, {"key": key, "done": done, "baseline_rss_mb": baseline})
            progress.finish(i, name, time.perf_counter() - m0,
                            f", peak RSS {receipt['peak_rss_mb']:.0f} MB (pnnx {receipt['pnnx_peak_rss_mb']:.0f} MB)")
    prep.timings["convert_s"] = time.perf_counter() - t0
    receipts = [{k: v for k, v in done[n].items() if k != "sha256"} for n in names]
    if records is not None:
        export_progress = _resume_state(t.torchscript_dir / "progress.json", prep.build_key)
    else:  # streamed: the export peaks were measured inside this loop
        export_progress = {"done": {n: {"peak_rss_mb": r.get("export_peak_rss_mb")} for n, r in done.items()},
                           "baseline_rss_mb": baseline}
    memory = {
        "streamed_traces": records is None,
        "export": memory_receipt(export_progress.get("done", {}), sizes, export_progress.get("baseline_rss_mb")),
        "convert": memory_receipt(done, sizes, baseline),
        "pnnx": memory_receipt({n: {"peak_rss_mb": r.get("pnnx_peak_rss_mb")} for n, r in done.items()}, sizes),
        "note": "peak RSS per module (VmHWM reset before each module, /proc); stage value = max over "
                "modules; baseline = RSS before the first module (interpreter, torch, skeleton); "
                "pnnx = its own process (VmHWM sampled every 20 ms)",
    }
    _copy_assets(prep.loaded, tmp / "assets")
    write_runtime_files(prep, tmp, sum(sizes.values()), precision="fp16-weights" if fp16_weights else "fp32")
    progress_file.unlink(missing_ok=True)
    write_manifest(tmp, model=t.model, source=t.source, config_hash=prep.config_hash,
                   build_key=prep.build_key, commands=receipts, memory=memory, modules=names)
    if fp16_weights:
        pin_derived_cases(t.model, tmp, "fp16-weights")
    remove_package(pkg)
    tmp.rename(pkg)  # the package appears whole or not at all
    _record_stage(t, (["exported"] if records is not None else []) + [state_key], prep)  # streamed: no traces kept
    return pkg


def rehash_manifest(pkg: Path) -> None:
    """Rewrite ``pkg``'s manifest over its present files, every other field kept (after a
    derived package's own files changed)."""
    m = read_json(pkg / "manifest.json")
    write_manifest(pkg, model=m["model"], source=m["source"], config_hash=m["config_sha256"],
                   build_key=m["build_key"], commands=m.get("pnnx_commands", []), memory=m.get("memory"),
                   modules=m.get("modules"))


def pin_derived_cases(model: str, pkg: Path, precision: str) -> None:
    """A derived package's e2e cases expect what ITS torch-free loop computes (fp16 or int8
    weights flip near-tied tokens of the seeded presets; parity judges that against torch by its
    own budgets), so the C++ loop and another machine can be compared with it byte for byte; the
    torch reference's values stay in each case as ``reference``. Re-hashes the manifest."""
    from ncnnport.drivers.verify import pin_cases

    same = pin_cases(pkg, precision)
    if same:
        differ = sorted(name for name, equal in same.items() if not equal)
        log(f"{model}: {pkg.name} cases pinned to its own loop ({len(same)} case(s); "
            f"{'differ from the torch reference: ' + ', '.join(differ) if differ else 'all equal to the torch reference'})")
        rehash_manifest(pkg)


def precision_package(prep: Prepared, setting: Any, force: bool = False) -> Path:
    """The package ``setting`` (a ``runtime.precision.Precision``) runs on: the pnnx fp16-weights
    package, the int8 package derived from the fp32 one, or the fp32 package itself."""
    if setting.fp16_weights:
        return convert_stage(prep, force=force, fp16_weights=True)
    fp32 = convert_stage(prep, force=force)
    return int8_weights_stage(prep, fp32, force=force) if setting.int8_weights else fp32


def int8_weights_stage(prep: Prepared, fp32: Path, force: bool = False) -> Path:
    """``package-int8w/`` beside ``fp32``: its matrix-vector InnerProducts in int8
    (``convert.int8_weights``); redone when the fp32 package (its manifest) or the code changed."""
    from ncnnport.convert.int8_weights import int8_package

    t = prep.target
    pkg = fp32.with_name("package-int8w")
    key = f"{prep.build_key}:{sha256_file(fp32 / 'manifest.json')}"
    if not force and _state(t).get("converted_int8w") == key and pkg.exists() and not check_package(pkg):
        log(f"{t.model}: int8 weights up to date ({pkg})")
        return pkg
    log(f"{t.model}: int8 weights: rewriting the matrix-vector InnerProducts of {fp32}")
    tmp = pkg.with_name(pkg.name + ".partial")
    remove_package(tmp)
    receipts = int8_package(fp32, tmp)
    pin_derived_cases(t.model, tmp, "int8-weights")
    if not receipts:
        log(f"{t.model}: int8 weights: no graph has a matrix-vector InnerProduct outside graph variants; "
            f"{pkg.name} computes what the fp32 package computes")
    for name, layers in receipts.items():
        log(f"{t.model}: int8 weights: {name}: {len(layers)} layer(s), "
            f"{sum(r['bytes_before'] for r in layers) / 2**20:.1f} -> {sum(r['bytes_after'] for r in layers) / 2**20:.1f} MiB")
    remove_package(pkg)
    tmp.rename(pkg)
    write_json(t.state_file, {**_state(t), "converted_int8w": key})
    return pkg


def torch_modules(prep: Prepared) -> dict[str, Any]:
    from ncnnport.runtime.session import TorchModule
    return {s.name: TorchModule(s.build(), s.to_json()) for s in prep.specs}

