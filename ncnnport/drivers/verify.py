"""``ncnnport verify``: check a package (folder or archive) on the device it will run on.

Order: the manifest (every file's sha256, the module list), ``model.json``, then every graph's
golden vectors on the chosen backend against the reference outputs, then every packaged e2e
case through the model's torch-free runtime. A package that fails its manifest runs nothing.
Neither torch nor transformers is imported on this path.

Golden rows are judged in the mode of the package's weight precision (``model.json`` field
``precision``) on the chosen backend: an fp32 package on the CPU by each graph's own fp32 gates, a
derived package (fp16 or int8 weights) by the packaged policy's budget for that precision, so a
package we build passes its own verification on the machine that built it. A derived package's
e2e cases expect what its own loop computed (``pin_cases``); the detail also says how that
compares with the torch reference's values the case keeps.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from ncnnport.contract import Tolerance
from ncnnport.metrics import compare, judge
from ncnnport.package.archive import extract_package, is_archive
from ncnnport.package.cases import CaseOnDisk, pin_case, read_cases
from ncnnport.package.golden import golden_path, read_golden
from ncnnport.package.manifest import MANIFEST, check_package, load_manifest
from ncnnport.package.model_json import DEFAULT_PRECISION, PackageError, read_model_json, read_package_precision
from ncnnport.package.reader import PackageReader, checked_reader
from ncnnport.runtime.options import RuntimeOptions


@dataclass(frozen=True)
class Check:
    """One row of the verify table."""

    kind: str      # manifest | versions | model.json | golden | case
    name: str
    passed: bool
    detail: str = ""


@contextlib.contextmanager
def package_folder(path: Path) -> Iterator[Path]:
    """``path`` itself for a folder; an archive is checked member by member and extracted into a
    temporary folder that is removed afterwards."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such package folder or archive")
    if path.is_dir():
        yield path
        return
    if not is_archive(path):
        raise ValueError(f"{path}: neither a package folder nor a .tar/.tar.gz/.tgz archive")
    with tempfile.TemporaryDirectory(prefix="ncnnport-package-") as tmp:
        yield extract_package(path, Path(tmp))


def version_warning(manifest: Mapping[str, Any]) -> str | None:
    """A warning naming both versions when the package was built with another ncnn."""
    built = manifest.get("versions", {}).get("ncnn")
    try:
        here = importlib.metadata.version("ncnn")
    except importlib.metadata.PackageNotFoundError:
        here = "not installed"
    if built and built != here:
        return f"package built with ncnn {built}, this machine has ncnn {here}: golden vectors decide"
    return None


def _tolerance(spec: Mapping[str, Any], output: str) -> Tolerance:
    tols = spec.get("tolerances", {})
    found = tols.get(output) or tols.get("*")
    return Tolerance(**found) if found else Tolerance()


def judging_mode(options: RuntimeOptions, package_precision: str = DEFAULT_PRECISION) -> str:
    """The policy mode that judges a run on ``options`` over a package whose weights are in
    ``package_precision``: a derived package's precision (its weights are what differs from the
    reference), else the precision of ``options``' ncnn flags, on ``options``' backend."""
    from ncnnport.runtime import precision

    setting = precision.get(package_precision) if package_precision != DEFAULT_PRECISION else precision.of_options(options)
    return precision.judging_mode(setting, options.use_vulkan)


def package_judging_mode(folder: Path, options: RuntimeOptions) -> str:
    """:func:`judging_mode` for the package at ``folder`` (its ``model.json`` precision)."""
    return judging_mode(options, read_package_precision(folder))


def _gates(folder: Path, name: str, spec: Mapping[str, Any], mode: str,
           graphs: Iterable[str]) -> Callable[[str], Tolerance]:
    """Per-output gate of graph ``name``: the spec's own (fp32) gates, or, in another mode, the
    packaged policy's budget for that mode; a package without a policy can only judge fp32. The
    policy is read with the package's ``graphs`` as its modules, so an entry for a graph the
    package does not hold (a misspelled name, which would never apply) is refused."""
    if mode == "fp32":
        return lambda output: _tolerance(spec, output)
    policy_file = folder / "policy.json"
    if not policy_file.is_file():
        raise PackageError(f"{policy_file}: missing; this package can be verified in fp32 on the CPU only "
                           f"(asked for {mode})")
    from ncnnport.parity.policy import Policy

    gates = Policy.load(policy_file, modules=graphs).module(name, mode)
    return lambda output: gates.get(output, gates["*"])


def golden_checks(reader: PackageReader, options: RuntimeOptions,
                  package_precision: str = DEFAULT_PRECISION) -> list[Check]:
    """Every graph of a checked package on ``options``' backend against its golden outputs, one
    row per graph and case (each graph opened for its own rows only), judged in the mode of that
    backend and the package's weight precision."""
    from ncnnport.runtime.session import NcnnModule

    mode = judging_mode(options, package_precision)
    rows = []
    for name, spec in reader.specs.items():
        path = golden_path(reader.folder, name)
        if not path.is_file():
            rows.append(Check("golden", name, False, f"{path}: missing"))
            continue
        gate = _gates(reader.folder, name, spec, mode, reader.specs)
        module = NcnnModule(reader.param(name), reader.bin(name), spec, options)
        for k, case in enumerate(read_golden(path)):
            outs = module.run(case.inputs)
            bad, worst = [], 0.0
            for t, ref, got in zip(module.outputs, case.outputs, outs):
                stats = compare(ref, got, what=f"{name}/{t.name}", feature_axis=t.feature_axis)
                ok, why = judge(stats, gate(t.name))
                worst = max(worst, stats.max_abs / max(stats.ref_absmax, 1e-30))
                if not ok:
                    bad.append(f"{t.name}: {why}")
            sizes = ",".join(f"{a}={n}" for a, n in case.sizes.items())
            rows.append(Check("golden", f"{name}[{sizes or k}]", not bad,
                              "; ".join(bad) if bad else f"relative max_abs {worst:.2e}"))
    return rows


def reference_note(case: CaseOnDisk) -> str:
    """For a case whose expected values a derived package pinned: which package precision
    computed them and which of their fields differ from the torch reference's; empty otherwise."""
    if case.reference is None:
        return ""
    differ = sorted(k for k in case.expected.keys() & case.reference.keys() if case.expected[k] != case.reference[k])
    versus = f"differs from the torch reference in {', '.join(differ)}" if differ else "equal to the torch reference"
    return f"expected = this {case.precision or 'derived'} package's own loop, {versus}"


def case_checks(reader: PackageReader, model_json: Mapping[str, Any], options: RuntimeOptions) -> list[Check]:
    """Every packaged e2e case through the model's torch-free runtime (graphs opened once)."""
    from ncnnport.registry import get_port
    from ncnnport.runtime.lazy_modules import LazyModules

    port = get_port(str(model_json["model"]))
    modules = LazyModules(reader.folder, options=options, _reader=reader)
    rows = []
    for case in read_cases(reader.folder):
        try:
            res = port.check_case(reader.folder, model_json, case, modules)
        except NotImplementedError as exc:  # expected values shipped, runtime not (yet) torch-free
            res = {"passed": False, "detail": f"not run: {exc}"}
        detail = "; ".join(d for d in (str(res.get("detail", "")), reference_note(case)) if d)
        rows.append(Check("case", case.name, bool(res["passed"]), detail))
    return rows


def pin_cases(folder: Path, precision: str, options: RuntimeOptions = RuntimeOptions()) -> dict[str, bool]:
    """Run every packaged case of the derived package at ``folder`` through its model's
    torch-free loop and pin the results as the case's ``expected`` (the torch reference's values
    kept as ``reference``, :func:`package.cases.pin_case`). Returns case name -> whether the
    package's results equal the reference's. The caller re-hashes the manifest."""
    from ncnnport.registry import get_port
    from ncnnport.runtime.lazy_modules import LazyModules

    model_json = read_model_json(folder)
    port = get_port(str(model_json["model"]))
    modules = LazyModules(folder, options=options)
    same = {}
    for case in read_cases(folder):
        run = port.run_case(folder, model_json, case, modules)
        reference = case.reference if case.reference is not None else case.expected
        same[case.name] = all(run.expected.get(k) == v for k, v in reference.items())
        pin_case(case, run.expected, run.files, precision)
    return same


def verify_package(folder: Path, options: RuntimeOptions) -> list[Check]:
    """All checks of an unpacked package, in order; a failed manifest stops there (nothing of a
    tampered package is run), a failed model.json skips only the e2e cases."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        return [Check("manifest", str(folder / MANIFEST), False, "missing")]
    manifest = load_manifest(folder / MANIFEST)
    problems = check_package(folder)
    rows = [Check("manifest", MANIFEST, not problems, "; ".join(problems) or f"{len(manifest['files'])} files match")]
    warning = version_warning(manifest)
    if warning:
        rows.append(Check("versions", "ncnn", True, f"warning: {warning}"))
    if problems:
        return rows
    package_precision = DEFAULT_PRECISION
    try:
        model_json = read_model_json(folder, expected_model=manifest.get("model"))
        package_precision = read_package_precision(folder)
        rows.append(Check("model.json", "model.json", True, f"{model_json['model']}, schema "
                          f"{model_json['schema_version']}, weights {package_precision}"))
    except PackageError as exc:  # the graphs can still be checked (as fp32); the e2e cases cannot
        model_json = None
        rows.append(Check("model.json", "model.json", False, str(exc)))
    reader = checked_reader(folder)  # hashed once above
    rows += golden_checks(reader, options, package_precision)
    if model_json is not None:
        rows += case_checks(reader, model_json, options)
    return rows


def table(rows: list[Check]) -> str:
    """The pass/fail table (Markdown)."""
    lines = ["| check | name | result | detail |", "|---|---|---|---|"]
    lines += [f"| {r.kind} | {r.name} | {'PASS' if r.passed else 'FAIL'} | {r.detail} |" for r in rows]
    failed = sum(not r.passed for r in rows)
    lines.append(f"\n{len(rows) - failed} passed, {failed} failed")
    return "\n".join(lines)


def open_for_run(folder: Path, model: str) -> tuple[dict[str, Any], str | None, PackageReader]:
    """(model.json, ncnn version warning, reader) of a package ``run --package`` may use: the manifest's
    model must be ``model`` and every file must match it (``run`` never rebuilds: a stale or
    tampered package is an error naming the file)."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise PackageError(f"{path}: missing (not a package folder)")
    manifest = load_manifest(path)
    if manifest.get("model") != model:
        raise PackageError(f"{path}: field 'model' is {manifest.get('model')!r}: a package of another model, not {model!r}")
    problems = check_package(folder)
    if problems:
        raise PackageError(f"{folder}: does not match its manifest ({'; '.join(problems[:5])}); "
                           "rebuild it with `ncnnport convert`/`ncnnport pack`, `run` never rebuilds")
    return read_model_json(folder, expected_model=model), version_warning(manifest), checked_reader(folder)
