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
from ncnnport.convert.manifest import check_package, tool_versions, write_manifest
from ncnnport.convert.pnnx_runner import convert_module
from ncnnport.export.tracing import export_module
from ncnnport.fsutil import read_json, sha256_json, write_json
from ncnnport.parity.policy import Policy
from ncnnport.registry import LoadedModel, ModelPort, get_port
from ncnnport.runtime.options import FP32, RuntimeOptions
from ncnnport.targets import Target, checkpoint_fingerprint, code_hash


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

    def spec(self, name: str) -> ModuleSpec:
        for s in self.specs:
            if s.name == name:
                return s
        raise KeyError(name)


def prepare(target: Target, precision: str = "fp32") -> Prepared:
    port = get_port(target.model)
    if target.ckpt is None and target.preset not in port.presets:
        raise ValueError(f"model {target.model}: unknown preset {target.preset!r}; "
                         f"available: {', '.join(port.presets)}")
    if target.ckpt is not None and not Path(target.ckpt).is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {target.ckpt}")
    t0 = time.perf_counter()
    loaded = port.load(target.preset, Path(target.ckpt) if target.ckpt else None)
    policy = Policy.load(port.policy_path)
    specs = port.module_specs(loaded)
    for s in specs:
        if not s.tolerances:
            s.tolerances = policy.module(s.name, precision)
    config_hash = sha256_json(loaded.config)
    key = sha256_json({
        "config": config_hash, "code": code_hash(target.model), "ckpt": checkpoint_fingerprint(target.ckpt),
        "preset": target.preset, "specs": [s.to_json() for s in specs], "versions": tool_versions(),
    })
    return Prepared(target, port, loaded, policy, specs, key, config_hash,
                    {"load_s": time.perf_counter() - t0})


def _state(target: Target) -> dict[str, Any]:
    return read_json(target.state_file) if target.state_file.is_file() else {}


def export_stage(prep: Prepared, force: bool = False) -> list[dict[str, Any]]:
    t = prep.target
    state = _state(t)
    if not force and state.get("exported") == prep.build_key and all(
            (t.torchscript_dir / f"{s.name}.pt").is_file() for s in prep.specs):
        log(f"{t.model}: export up to date ({len(prep.specs)} modules)")
        return [read_json(t.torchscript_dir / f"{s.name}.spec.json") for s in prep.specs]
    if t.torchscript_dir.exists():
        shutil.rmtree(t.torchscript_dir)
    records = []
    t0 = time.perf_counter()
    for i, spec in enumerate(prep.specs, 1):
        log(f"{t.model}: export [{i}/{len(prep.specs)}] {spec.name}")
        records.append(export_module(spec, t.torchscript_dir))
    prep.timings["export_s"] = time.perf_counter() - t0
    write_json(t.state_file, {"exported": prep.build_key})  # conversions of older exports are stale
    return records


def _copy_assets(loaded: LoadedModel, dest: Path) -> None:
    for name, src in loaded.assets.items():
        target = dest / name
        if Path(src).is_dir():
            shutil.copytree(src, target, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.pt", "__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)


def convert_stage(prep: Prepared, force: bool = False, fp16_weights: bool = False) -> Path:
    """Convert every exported module into ``package/`` (``package-fp16w/`` for pnnx fp16 weights,
    an opt-in precision mode measured by the option sweep)."""
    t = prep.target
    records = export_stage(prep, force=force)
    state = _state(t)
    pkg = t.package_dir if not fp16_weights else t.package_dir.with_name("package-fp16w")
    state_key = "converted" if not fp16_weights else "converted_fp16w"
    if not force and state.get(state_key) == prep.build_key and not check_package(pkg):
        log(f"{t.model}: convert up to date ({pkg})")
        return pkg
    tmp = pkg.with_name(pkg.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "ncnn").mkdir(parents=True)
    (tmp / "specs").mkdir()
    receipts = []
    t0 = time.perf_counter()
    for i, rec in enumerate(records, 1):
        log(f"{t.model}: convert [{i}/{len(records)}] {rec['name']}")
        receipts.append(convert_module(rec, t.torchscript_dir / rec["torchscript"], tmp / "ncnn",
                                       fp16_weights=fp16_weights))
        write_json(tmp / "specs" / f"{rec['name']}.spec.json", rec)
    prep.timings["convert_s"] = time.perf_counter() - t0
    _copy_assets(prep.loaded, tmp / "assets")
    write_manifest(tmp, model=t.model, source=t.source, config_hash=prep.config_hash,
                   build_key=prep.build_key, commands=receipts)
    if pkg.exists():
        shutil.rmtree(pkg)
    tmp.rename(pkg)  # the package appears whole or not at all
    write_json(t.state_file, {**_state(t), "exported": prep.build_key, state_key: prep.build_key})
    return pkg


def open_ncnn_modules(package: Path, names: Sequence[str] | None = None,
                      options: RuntimeOptions = FP32) -> dict[str, Any]:
    """One NcnnModule per graph of a package (its own Net and options each)."""
    from ncnnport.runtime.session import NcnnModule

    problems = check_package(package)
    if problems:
        raise RuntimeError(f"package {package} does not match its manifest:\n  " + "\n  ".join(problems))
    specs = {p.name[: -len(".spec.json")]: read_json(p) for p in sorted((package / "specs").glob("*.spec.json"))}
    wanted = names if names is not None else list(specs)
    return {n: NcnnModule(package / "ncnn" / f"{n}.ncnn.param", package / "ncnn" / f"{n}.ncnn.bin",
                          specs[n], options) for n in wanted}


def torch_modules(prep: Prepared) -> dict[str, Any]:
    from ncnnport.runtime.session import TorchModule
    return {s.name: TorchModule(s.build(), s.to_json()) for s in prep.specs}
