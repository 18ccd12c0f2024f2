"""``ncnnport`` command line. Verbs mirror the Makefile targets and take the same options."""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

from ncnnport.paths import DEFAULT_BUILD_ROOT
from ncnnport.registry import available_models, get_port, model_names
from ncnnport.targets import Target

# `bench`'s rounds: the stability table's 20 calls, and for the speed table (`--perf`) 24, where a
# stage's two sizes share one loop of 4 calls (torch, ncnn at each) or 6 (with the ONNX Runtime
# peer) in perf_timing.round_order: any even count runs every pair of calls in each order in half
# the rounds, and 24, a multiple of 2 x 4 and 2 x 6, also puts every call in every position
# equally often (the plain rotation before needed 24 for the sizes alone: 20 gave 9 and 11 with
# the peer, and torch ran before ncnn in 20 of 24 rounds).
STABILITY_RUNS = 20
PERF_RUNS = 24


def default_runs(perf: bool) -> int:
    """`bench --runs` when not given: the speed table's or the stability table's."""
    return PERF_RUNS if perf else STABILITY_RUNS


def _common(p: argparse.ArgumentParser, *, many_models: bool = True) -> None:
    if many_models:
        p.add_argument("model", nargs="?", default=None,
                       help="model name (default: every model that exists)")
    p.add_argument("--preset", default=os.environ.get("PRESET") or "tiny",
                   help="embedded preset with seeded weights (default: tiny)")
    p.add_argument("--ckpt", type=Path, default=None,
                   help="local Hugging Face-format checkpoint folder (overrides --preset)")
    p.add_argument("--layers", type=int, default=int(os.environ["LAYERS"]) if os.environ.get("LAYERS") else None,
                   metavar="K", help="keep only the first K layers of every stack (models that support it)")
    p.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD_ROOT, help="artifact root (default: build)")
    p.add_argument("--force", action="store_true", help="redo export and conversion even if up to date")
    p.add_argument("--lock-timeout", type=float, default=-1, metavar="S",
                   help="a build folder in use by another ncnnport process: wait at most S seconds "
                        "(0: fail at once naming its pid; default: wait)")


def _precision_option(p: argparse.ArgumentParser) -> None:
    """``--precision``: the one vocabulary (runtime.precision) of run, parity and bench."""
    from ncnnport.runtime.precision import NAMES, PRECISIONS
    p.add_argument("--precision", choices=NAMES, default="fp32",
                   help="numeric setting, judged by the policy mode of the same name: "
                        + "; ".join(f"{n}: {PRECISIONS[n].why}" for n in NAMES))


def say(text: str, stream: Any = None) -> None:
    """Print ``text`` whatever its characters: a non-UTF-8 file name (surrogate-escaped by
    Python) is shown with its raw bytes escaped instead of raising UnicodeEncodeError."""
    stream = stream or sys.stdout
    enc = getattr(stream, "encoding", None) or "utf-8"
    raw = text.encode(enc, "surrogateescape") if enc.lower().replace("-", "") == "utf8" else text.encode(enc, "replace")
    print(raw.decode(enc, "backslashreplace"), file=stream)


@contextlib.contextmanager
def _locked(t: Target, args: argparse.Namespace) -> Iterator[None]:
    """Hold the target's build folder for a whole verb (export, convert, parity, run)."""
    from ncnnport.fsutil import build_lock
    with build_lock(t.root, timeout=getattr(args, "lock_timeout", -1)):
        yield


def _models(arg: str | None) -> list[str]:
    if arg:
        get_port(arg)  # fails with the known names
        return [arg]
    models = available_models()
    if not models:
        raise SystemExit("no model folders are installed")
    return models


def _targets(args: argparse.Namespace) -> list[Target]:
    ckpt = args.ckpt if args.ckpt else None
    models = _models(args.model)
    if ckpt is not None and len(models) != 1:
        raise SystemExit("--ckpt needs one model name")
    return [Target(m, args.preset, ckpt, args.build_dir, layers=args.layers) for m in models]


def cmd_export(args: argparse.Namespace) -> int:
    from ncnnport.stages import export_stage, log, prepare
    for t in _targets(args):
        with _locked(t, args):
            export_stage(prepare(t), force=args.force)
        log(f"{t.model}: TorchScript modules in {t.torchscript_dir}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from ncnnport.stages import convert_stage, log, prepare
    for t in _targets(args):
        with _locked(t, args):
            pkg = convert_stage(prepare(t), force=args.force)
        log(f"{t.model}: ncnn package in {pkg}")
    return 0


def cmd_parity(args: argparse.Namespace) -> int:
    from ncnnport.nightly import full_parity
    from ncnnport.reports.summary import write_report
    from ncnnport.stages import convert_stage, prepare
    ok = True
    targets = _targets(args)
    if args.stream and args.precision != "fp32":
        raise ValueError(f"--stream runs fp32 only (one module of each side resident); got --precision {args.precision}")
    if args.runtime == "cpp":
        clash = [f for f, on in (("--stream", args.stream), ("--sweep", args.sweep), ("--official-ref", args.official_ref),
                                 (f"--precision {args.precision}", args.precision != "fp32")) if on]
        if clash:
            raise ValueError(f"--runtime cpp runs the fp32 C++ executables only; drop {', '.join(clash)}")
    for t in targets:  # user files are checked before any model is built
        get_port(t.model).validate_inputs(args.input or [])
        if args.runtime == "cpp" and not get_port(t.model).cpp_executable:
            raise ValueError(f"--runtime cpp: model {t.model} has no C++ runtime (its port names no cpp_executable)")
    for t in targets:
        with _locked(t, args):
            prep = prepare(t)
            pkg = convert_stage(prep, force=args.force)
            if args.runtime == "cpp":
                from ncnnport.drivers.cpp_parity import run_cpp_parity
                summary = run_cpp_parity(prep, pkg, user_inputs=args.input or [])
            elif args.stream:
                from ncnnport.drivers.parity import run_streamed_parity
                summary = run_streamed_parity(prep, pkg, user_inputs=args.input or [])
            else:
                summary = full_parity(prep, pkg, user_inputs=args.input or [], sweep_options=args.sweep,
                                      precision=args.precision, official_ref=args.official_ref)
        if args.sweep:
            from ncnnport.parity.sweep import sweep_table
            print(f"\n## {t.model}: option sweep\n" + sweep_table(summary["option_sweep"]))
        if summary.get("official_reference"):
            print(f"\n## {t.model}: distance to the official package (reported, not gated)\n"
                  + official_table(summary["official_reference"]))
        suffix = "-cpp" if args.runtime == "cpp" else "-streamed" if args.stream else ""
        path = write_report(summary, t.report_dir.with_name(t.report_dir.name + suffix))
        _print_gates(f"{t.model} ({t.source}{', streamed' if args.stream else ''}"
                     f"{', cpp runtime' if args.runtime == 'cpp' else ''})", summary, path)
        ok = ok and summary["gates_passed"]
    return 0 if ok else 1


def official_table(rows: list[dict]) -> str:
    """Markdown rows of ``parity --official-ref``: per fixture, whether tokens/text agree and where
    they first differ, or why the official package was not run."""
    lines = ["| fixture | tokens equal | first differing chunk / step | text equal | note |", "|---|---|---|---|---|"]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"| {r.get('fixture', '*')} | - | - | - | skipped: {r.get('reason', '')} |")
            continue
        where = ("-" if r.get("first_diff_step") is None
                 else f"{r.get('first_diff_chunk')} / {r.get('first_diff_step')}")
        lines.append(f"| {r.get('fixture')} | {r.get('tokens_equal')} | {where} | {r.get('text_equal')} | "
                     f"{r.get('reason', '')} |")
    return "\n".join(lines)


def _print_gates(title: str, summary: dict, summary_path: Path) -> None:
    from ncnnport.reports.summary import gate_table
    print(f"\n## {title}: {'PASSED' if summary['gates_passed'] else 'FAILED'}")
    print(gate_table(summary))
    print(f"report: {summary_path.parent / 'report.md'} (also report.html, junit.xml)\nsummary: {summary_path}")


def summary_path(path: Path) -> Path:
    """A summary given as its file or as the report folder holding ``summary.json``."""
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(errno.ENOENT, "no summary.json there", str(path))
    return path


def load_summary(path: Path) -> dict[str, Any]:
    """A summary.json checked to be a JSON object with ``modules`` and ``e2e`` record lists."""
    from ncnnport.fsutil import read_json
    summary = read_json(path)
    if not isinstance(summary, dict):
        raise ValueError(f"{path}: a summary must be a JSON object")
    for key in ("modules", "e2e"):
        if not isinstance(summary.get(key), list) or not all(isinstance(r, dict) for r in summary[key]):
            raise ValueError(f"{path}: field {key!r} must be a list of records")
    return summary


def cmd_report(args: argparse.Namespace) -> int:
    from ncnnport.reports.summary import verified_gates, write_report
    ok = True
    old = None
    if args.compare:
        compare_path = summary_path(args.compare)
        old = load_summary(compare_path)
    for t in _targets(args):
        path = t.report_dir / "summary.json"
        if not path.is_file():
            say(f"{t.model}: no summary at {path}; run `ncnnport parity {t.model}` first", sys.stderr)
            ok = False
            continue
        summary = load_summary(path)
        for line in verified_gates(summary):  # a hand-edited verdict is not believed
            say(f"{t.model}: {line}", sys.stderr)
        write_report(summary, t.report_dir)
        if old is not None:
            from ncnnport.reports.compare import regressions
            found = regressions(old, summary)
            say(f"\nregressions vs {compare_path}: {len(found)}")
            for line in found:
                say(f"  - {line}")
            ok = ok and not found
        _print_gates(t.model, summary, path)
        ok = ok and summary["gates_passed"]
    return 0 if ok else 1


def _check_jobs(args: argparse.Namespace) -> list[tuple[Path, list[str] | None]]:
    """(package folder, expected module list) to check: a model's build package against the
    module list its port derives (a package holding 3 of 10 graphs fails); ``--package``
    against the module list its manifest recorded at build time."""
    if args.package:
        return [(args.package, None)]
    from ncnnport.stages import prepare
    return [(t.package_dir, [s.name for s in prepare(t).specs]) for t in _targets(args)]


def cmd_check(args: argparse.Namespace) -> int:
    from ncnnport.package.manifest import MANIFEST, check_package, load_manifest
    bad = 0
    for folder, expected in _check_jobs(args):
        if Path(folder).is_file():
            raise NotADirectoryError(errno.ENOTDIR, "a package is a folder, not a file", str(folder))
        if (Path(folder) / MANIFEST).is_file():
            load_manifest(Path(folder) / MANIFEST)  # wrong JSON types: one error line, exit 2
        problems = check_package(folder, expected=expected)
        say(f"{folder}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
        for p in problems:
            say(f"  - {p}")
        bad += bool(problems)
    return 1 if bad else 0


def _stage_list(text: str | None) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def cmd_bench(args: argparse.Namespace) -> int:
    from ncnnport.drivers.bench import run_bench, run_interleave, write_json
    from ncnnport.stages import convert_stage, precision_package, prepare
    from ncnnport.drivers.torch_ratio import perf_report, torch_ratio_table

    from ncnnport.runtime import precision

    if args.runs is None:
        args.runs = default_runs(args.perf)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    sizes = [s.strip() for s in args.sizes.split(",")] if args.sizes else None
    if sizes is not None and (len(set(sizes)) != len(sizes) or "" in sizes):
        raise ValueError(f"bench --sizes {args.sizes}: give each size once (a stage's sizes share one timed loop)")
    setting = precision.get(args.precision)
    out = {}
    for t in _targets(args):
        prep = prepare(t)
        ref_pkg = convert_stage(prep, force=args.force)  # the fp32 graphs a reduced precision is judged by
        pkg = precision_package(prep, setting, force=args.force)  # fp16 or int8 weights: their own package
        prec = {"precision": setting.name, "reference_package": ref_pkg}
        if args.perf and (args.torch_device or backends != ["cpu"]):  # runtimes side by side, with parity
            res = {"devices": _device_perf(args, prep, pkg, backends, sizes)}
            path = args.build_dir / "reports" / "bench" / f"{t.model}-{t.tag}-devices{_bench_suffix(setting.name, False)}.json"
            write_json(path, res)
            print(f"json: {path}")
            out[t.model] = res
            continue
        if args.perf:  # the speed table only: ncnn vs torch vs the bandwidth bound
            perf = prep.port.bench_perf_stages()
            stages = _stage_list(args.stage) or list(perf)
            print(f"\n## bench --perf {t.model} ({t.source}), threads={','.join(map(str, _threads_list(args)))}, "
                  f"rounds={args.runs} (torch, ncnn, ONNX Runtime interleaved), "
                  f"precision={setting.name}")
            res = perf_report(prep, pkg, stages, sizes, _threads_list(args), args.runs,
                              stage_sizes={**prep.port.bench_stages(), **perf}, **prec)
            path = args.build_dir / "reports" / "bench" / f"{t.model}-{t.tag}-perf{_bench_suffix(setting.name)}.json"
            write_json(path, res)
            print(f"json: {path}")
            out[t.model] = res
            continue
        stages = _stage_list(args.stage) or list(prep.port.bench_stages())
        if not stages:
            print(f"{t.model}: no bench stages")
            continue
        print(f"\n## bench {t.model} ({t.source}), threads={args.threads}, warmup={args.warmup}, runs={args.runs}, "
              f"precision={setting.name}")
        res = {"stages": run_bench(prep, pkg, stages, backends, sizes, args.threads, args.warmup, args.runs, **prec)}
        if args.interleave and len(stages) >= 1:
            pairs = [(s, (sizes or prep.port.bench_stages()[s])[0]) for s in prep.port.bench_stages()]
            res["interleave"] = run_interleave(prep, pkg, pairs, args.interleave, args.threads, setting.name)
        if args.torch:
            res["torch_ratio"] = torch_ratio_table(prep, pkg, stages, sizes, args.threads, args.runs, **prec)
        path = args.build_dir / "reports" / "bench" / f"{t.model}{_bench_suffix(setting.name, False)}.json"
        write_json(path, res)
        print(f"json: {path}")
        out[t.model] = res
    return 0


def _threads_list(args: argparse.Namespace) -> list[int]:
    """``--threads-list 1,2`` (each stage at each count), else ``--threads``; one error line for
    a count that is not a positive integer."""
    if not args.threads_list:
        return [args.threads]
    try:
        counts = [int(x) for x in args.threads_list.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--threads-list {args.threads_list!r}: use positive integers, e.g. 1,2") from None
    if not counts or min(counts) < 1:
        raise SystemExit(f"--threads-list {args.threads_list!r}: use positive integers, e.g. 1,2")
    return counts


def _bench_suffix(precision_name: str, tuned: bool = True) -> str:
    """The bench JSON name's tail: the precision unless fp32 (so an fp16 run does not overwrite
    the fp32 one) and, for the speed table, ``-hugepages`` under glibc malloc huge pages."""
    from ncnnport.drivers.torch_ratio import huge_pages_malloc

    tail = "" if precision_name == "fp32" else f"-{precision_name}"
    return tail + ("-hugepages" if tuned and huge_pages_malloc() else "")


def _device_perf(args: argparse.Namespace, prep: Any, pkg: Path, backends: list[str],
                 sizes: list[str] | None) -> list[dict[str, Any]]:
    """``bench --perf`` with ``--torch-device`` or a non-CPU backend: every runtime's row."""
    from ncnnport.drivers.device_bench import device_table
    perf = prep.port.bench_perf_stages()
    stages = _stage_list(args.stage) or list(perf)
    devices = _stage_list(args.torch_device)
    print(f"\n## bench --perf {prep.target.model} ({prep.target.source}): torch cpu{''.join(',' + d for d in devices)} "
          f"vs ncnn {','.join(backends)} ({args.precision}), threads={args.threads}, warmup={args.warmup}, runs={args.runs}")
    return device_table(prep, pkg, stages, sizes, backends, devices, args.threads, args.warmup, args.runs,
                        stage_sizes={**prep.port.bench_stages(), **perf}, precision=args.precision)


def cmd_bench_cpp(args: argparse.Namespace) -> int:
    """``bench-cpp``: the C++ loop vs the Python ncnn loop vs torch eager (drivers/cpp_bench.py)."""
    from ncnnport.drivers.cpp_bench import bench_sizes, bench_target, check_options
    from ncnnport.runtime.precision import get as get_precision
    from ncnnport.stages import precision_package, prepare
    ok = True
    sizes = bench_sizes(args.sizes)
    for t in _targets(args):
        check_options(t.model, args.rounds, args.new_tokens, args.vulkan, args.torch_device, not args.no_torch,
                      args.precision, args.huge_pages)
    for t in _targets(args):
        with _locked(t, args):
            prep = prepare(t)
            pkg = precision_package(prep, get_precision(args.precision), force=args.force)
            report = bench_target(prep, pkg, sizes, args.new_tokens, args.rounds, args.threads, not args.no_torch,
                                  t.build_root / "reports" / "bench-cpp", args.vulkan, args.torch_device,
                                  args.precision, args.huge_pages)
        ok = ok and report["passed"]
    return 0 if ok else 1


def cmd_bench_package(args: argparse.Namespace) -> int:
    from ncnnport.drivers.bench import write_json
    from ncnnport.drivers.package_bench import bench_package
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    rows = bench_package(args.package, backends, args.threads, args.warmup, args.runs,
                         [m for m in args.modules.split(",")] if args.modules else None)
    if args.json:
        write_json(args.json, rows)
    bad = [r for r in rows if not r["identical_outputs"]]
    return 1 if bad else 0


def cmd_nightly(args: argparse.Namespace) -> int:
    from ncnnport.nightly import run_nightly
    return run_nightly(_targets(args), args.build_dir / "nightly")


def cmd_isa_replay(args: argparse.Namespace) -> int:
    """``dump``: a model's torch reference cases (native, needs torch); ``replay``: every sweep
    variant on dumped cases with ncnn and numpy only (runs under an emulated CPU)."""
    if args.step == "dump":
        from ncnnport.drivers.isa_replay import dump_cases
        from ncnnport.stages import prepare
        print(f"{dump_cases(prepare(Target(args.model)), args.cases)} cases in {args.cases}")
        return 0
    from ncnnport.parity.isa_replay import INDEX, replay, replay_table
    from ncnnport.parity.policy import Policy
    for path in (args.package / "manifest.json", args.cases / INDEX, args.policy):
        if not path.is_file():
            say(f"ncnnport isa-replay: error: {path} not found", sys.stderr)
            return 2
    from ncnnport.package.manifest import load_manifest, package_modules
    graphs = package_modules(load_manifest(args.package / "manifest.json")["files"])
    rows = replay(args.package, args.cases, Policy.load(args.policy, modules=graphs))
    print(replay_table(rows))
    return 0 if all(r["passed"] for r in rows) else 1


def seeded_note(t: Target) -> str | None:
    """The one line ``run`` prints when it runs seeded weights: their output is filler."""
    if t.ckpt is not None:
        return None
    return (f"note: {t.model} runs seeded weights (preset {t.preset}), not a checkpoint: its output is "
            "filler by construction (text comes out as filler tokens); pass --ckpt FOLDER for real output")


def cmd_run(args: argparse.Namespace) -> int:
    """Run the port; ``args`` holds the generic options and the model's own (one parser, so
    ``ncnnport run MODEL --help`` lists both)."""
    port = get_port(args.model)
    margs = args
    port.validate_run_args(margs)  # before the model load: a bad input fails in milliseconds
    if args.package is not None:
        return run_from_package(port, args)
    from ncnnport.stages import precision_package, prepare
    from ncnnport.runtime.lazy_modules import LazyModules
    t = Target(args.model, args.preset, args.ckpt, args.build_dir, layers=args.layers)
    note = seeded_note(t)
    if note:
        say(note, sys.stderr)
    from ncnnport.runtime import precision
    from ncnnport.runtime.options import RuntimeOptions
    setting = precision.get(args.precision)
    with _locked(t, args):
        prep = prepare(t)
        pkg = precision_package(prep, setting, force=args.force)
    options = setting.options(RuntimeOptions(num_threads=args.threads, low_memory=args.low_memory))
    # the one runner lifecycle: a graph opens when the port first uses it, and a port may release it
    modules = LazyModules(pkg, options=options)
    return int(port.run(prep.loaded, modules, margs) or 0)


def run_from_package(port: Any, args: argparse.Namespace) -> int:
    """``run MODEL --package DIR|ARCHIVE``: the port on the package alone (no torch, no
    transformers, no rebuild)."""
    from ncnnport.drivers.verify import open_for_run, package_folder
    from ncnnport.runtime import precision
    from ncnnport.runtime.options import RuntimeOptions
    setting = precision.get(args.precision)
    if setting.fp16_weights or setting.int8_weights:
        kind = "fp16" if setting.fp16_weights else "int8"
        raise ValueError(f"--precision {args.precision} needs a package converted with {kind} weights; "
                         "pass that package with --package and --precision fp32")
    options = setting.options(RuntimeOptions(num_threads=args.threads, low_memory=args.low_memory))
    from ncnnport.runtime.lazy_modules import LazyModules
    with package_folder(args.package) as folder:
        model_json, warning, reader = open_for_run(folder, args.model)
        if warning:
            say(f"warning: {warning}", sys.stderr)
        modules = LazyModules(folder, options=options, _reader=reader)  # each graph opened when first used
        return int(port.run_package(folder, model_json, modules, args) or 0)


def cmd_verify(args: argparse.Namespace) -> int:
    """Manifest, model.json, every golden vector and every e2e case of a package (folder or
    archive) on one backend; exit 1 when any check fails."""
    from ncnnport.drivers.verify import package_folder, table, verify_package
    from ncnnport.runtime.options import RuntimeOptions
    options = RuntimeOptions(num_threads=args.threads, use_vulkan=args.backend == "vulkan")
    from ncnnport.drivers.verify import judging_mode, package_judging_mode
    from ncnnport.package.model_json import PackageError
    with package_folder(args.package) as folder:
        rows = verify_package(folder, options)
        try:  # a derived package's rows are judged in its weights' precision
            mode = package_judging_mode(folder, options)
        except PackageError:  # a bad model.json is a failed row; its golden rows were judged as fp32
            mode = judging_mode(options)
    from ncnnport.runtime.vulkan import device_for, vulkan_text
    device = vulkan_text(device_for("vulkan")).lstrip("; ") if options.use_vulkan else "CPU"
    say(f"## verify {args.package} ({options.label}; judged as {mode}; {device})")
    say(table(rows))
    return 0 if all(r.passed for r in rows) else 1


def cmd_pack(args: argparse.Namespace) -> int:
    """Build (if needed) and archive each model's package: ``<model>-<tag>.tar.gz``, its
    ``.sha256`` and the per-file ``checksums.sha256`` in ``--out``."""
    from ncnnport.package.archive import CHECKSUMS, write_archive
    from ncnnport.stages import convert_stage, prepare
    for t in _targets(args):
        with _locked(t, args):
            pkg = convert_stage(prepare(t), force=args.force)
            archive = write_archive(pkg, args.out, f"{t.model}-{t.tag}")
        say(f"{t.model}: {archive} (sha256 in {archive.name}.sha256, per file in {args.out / CHECKSUMS})")
    return 0


def cmd_test(args: argparse.Namespace, extra: Sequence[str]) -> int:
    return subprocess.call([sys.executable, "-m", "pytest", *extra])


def _run_model(argv: Sequence[str]) -> str | None:
    """The model named on a ``run`` command line (the first argument that is a model name)."""
    names = set(model_names())
    return next((a for a in argv[1:] if a in names), None)


def build_parser(run_model: str | None = None) -> argparse.ArgumentParser:
    """The CLI parser; with ``run_model``, ``run`` also carries that model's own options."""
    parser = argparse.ArgumentParser(prog="ncnnport", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True)
    for verb in ("export", "convert"):
        _common(sub.add_parser(verb))
    p = sub.add_parser("report", help="re-render the reports from summary.json; --compare flags regressions")
    _common(p)
    p.add_argument("--compare", type=Path, default=None, metavar="OLD_SUMMARY",
                   help="an earlier summary.json of the same model: exit non-zero on regressions")
    p = sub.add_parser("parity", help="export + convert as needed, then local and e2e parity")
    _common(p)
    p.add_argument("--input", type=Path, action="append",
                   help="your own input file for the e2e parity (repeatable)")
    p.add_argument("--sweep", action="store_true",
                   help="also rerun under every ncnn precision/thread/backend option and pnnx fp16 weights")
    p.add_argument("--stream", action="store_true",
                   help="full-depth parity holding one module of each side at a time (models too large "
                        "for the reference and the package in memory together)")
    p.add_argument("--official-ref", action="store_true",
                   help="also report the distance to the model's official package on the same fixtures "
                        "(qwen3-asr: the qwen-asr venv named by NCNNPORT_QWEN_ASR_OFFICIAL_PYTHON); "
                        "reported, never gated")
    p.add_argument("--runtime", choices=("python", "cpp"), default="python",
                   help="cpp: run the fixtures and --input files through the model's C++ executable "
                        "(build/cpp/, built by `make cpp` when missing) and judge its token ids against the "
                        "Python package loop and the torch reference; report in build/reports/<model>-cpp/")
    _precision_option(p)
    p = sub.add_parser("bench", help="repeated-call stability: latency, drift, RSS, identical outputs")
    _common(p)
    p.add_argument("--stage", default=None, help="bench stage or comma list (default: every stage of the model)")
    p.add_argument("--backends", default="cpu", help="comma list of cpu, vulkan")
    p.add_argument("--sizes", default=None, help="comma list of sizes (stage-specific, e.g. 16,512)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--runs", type=int, default=None,
                   help=f"timed rounds (default {STABILITY_RUNS}; with --perf {PERF_RUNS}: even, so every two "
                        "calls of a round, runtimes and sizes, run in each order in half the rounds, and a "
                        "multiple of 8 and 12, so every call takes every position equally often)")
    p.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                   help="also alternate all stages for ROUNDS rounds in one process")
    p.add_argument("--torch", action="store_true", help="also time PyTorch eager on the same work")
    p.add_argument("--perf", action="store_true",
                   help="speed table only: ncnn vs PyTorch eager vs the memory-bandwidth bound (make bench-perf); "
                        "with --torch-device or a non-cpu backend: one row per runtime with parity vs torch cpu")
    p.add_argument("--threads-list", default=None, metavar="N[,N]",
                   help="with --perf: run every stage at each thread count and report the scaling efficiency")
    p.add_argument("--torch-device", default=None, metavar="DEV[,DEV]",
                   help="with --perf: also time PyTorch eager on these torch devices (e.g. cuda)")
    _precision_option(p)
    p = sub.add_parser("bench-cpp", help="per-token decode (SeedVR2: one image end to end) of the C++ loop vs the "
                                          "Python ncnn loop vs torch eager, interleaved; build/reports/bench-cpp/")
    _common(p)
    p.add_argument("--sizes", default=None, metavar="P[,P]",
                   help="prompt lengths (LLMs, default 100,1000) or the square image side (seedvr2, default 256)")
    p.add_argument("--new-tokens", type=int, default=16, help="tokens generated per run (default 16)")
    p.add_argument("--rounds", type=int, default=4,
                   help="interleaved rounds (C++, Python, torch each once; default 4: even, so every two "
                        "sizes, and every two runtimes, run in each order in half of them)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-torch", action="store_true", help="leave the torch eager column out")
    p.add_argument("--vulkan", action="store_true",
                   help="run the C++ executable (make cpp VULKAN=1 build) and the Python ncnn loop on the Vulkan device")
    p.add_argument("--torch-device", default="cpu", metavar="DEV",
                   help="torch device of the torch eager column (default cpu; e.g. cuda, where the model's loop serves it)")
    p.add_argument("--precision", default="fp32", metavar="NAME",
                   help="runtime/precision.py name both ncnn loops run (the executable's --precision, the Python "
                        "graphs' options): fp32 (default), fp16-storage or bf16, or "
                        "int8-weights (package-int8w, both loops in fp32 flags); the bound counts InnerProduct "
                        "weights at that precision's width; torch stays fp32")
    p.add_argument("--huge-pages", action="store_true",
                   help="decode models: both ncnn loops collapse their loaded weights onto 2 MiB pages (the "
                        "executables' --huge-pages, RuntimeOptions.huge_pages; the Python loop's pass also takes "
                        "torch's resident weights in the same process); slower load, faster tokens")
    p = sub.add_parser("bench-package", help="bench and cross-check a converted package alone "
                                              "(no model code): every graph on cpu / vulkan")
    p.add_argument("package", type=Path)
    p.add_argument("--backends", default="cpu,vulkan")
    p.add_argument("--modules", default=None, help="comma list of graph names (default: all)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--json", type=Path, default=None)
    p = sub.add_parser("nightly", help="every model, fixture and precision mode + stability; "
                                        "exit 1 on a failed gate or a regression vs the last nightly")
    _common(p)
    p = sub.add_parser("check", help="verify a package folder against its manifest")
    _common(p)
    p.add_argument("--package", type=Path, help="package folder (default: the model's build package)")
    p = sub.add_parser("run", help="run the ported model with ncnn (model options follow)")
    p.add_argument("model")
    _common(p, many_models=False)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--package", type=Path, default=None, metavar="DIR|ARCHIVE",
                   help="run this package alone (folder or .tar.gz from `ncnnport pack`): no torch, no "
                        "transformers, never rebuilt; --preset/--ckpt/--layers are ignored")
    p.add_argument("--low-memory", action="store_true",
                   help="graphs marked release_after_call (e.g. the SeedVR2 VAE) return their activation "
                        "memory after each call: peak = the largest such graph, not their sum; a pipeline "
                        "with stages (SeedVR2: encode, DiT, decode) also closes each stage's graphs once it "
                        "is done; slower")
    _precision_option(p)
    if run_model is not None:
        get_port(run_model).add_run_arguments(p.add_argument_group(f"{run_model} options"))
    p = sub.add_parser("isa-replay", help="local parity of every sweep variant replayed on another ISA path "
                                           "(e.g. under qemu) from dumped torch cases")
    steps = p.add_subparsers(dest="step", required=True)
    d = steps.add_parser("dump", help="torch reference cases of a model's tiny preset (native, needs torch)")
    d.add_argument("model")
    d.add_argument("cases", type=Path)
    r = steps.add_parser("replay", help="every sweep variant on the dumped cases (ncnn + numpy only)")
    r.add_argument("package", type=Path)
    r.add_argument("cases", type=Path)
    r.add_argument("policy", type=Path)
    p = sub.add_parser("verify", help="check a package (folder or archive) on this device: manifest, "
                                      "model.json, golden vectors, e2e cases; exit 1 on a failure")
    p.add_argument("package", type=Path)
    p.add_argument("--backend", choices=("cpu", "vulkan"), default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p = sub.add_parser("pack", help="archive each model's package (.tar.gz + .sha256 + checksums.sha256)")
    _common(p)
    p.add_argument("--out", type=Path, required=True, help="folder for the archives")
    sub.add_parser("test", help="run the test suite (pytest arguments follow)")
    return parser


USER_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.EISDIR,
               errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.EDQUOT}


def user_error(exc: BaseException) -> str | None:
    """One line for an error the user can fix (bad input, missing or mistyped file, full or
    read-only disk, undecodable name); None for anything else (a bug: keep its traceback)."""
    if isinstance(exc, OSError) and not isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError,
                                                          PermissionError)) and exc.errno not in USER_ERRNOS:
        return None
    if isinstance(exc, OSError) and exc.filename is not None:
        where = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 is not None else "")
        return f"{where}: {exc.strerror or exc}"
    if isinstance(exc, (OSError, ValueError, UnicodeError, KeyError, RuntimeError)):
        text = str(exc) if not isinstance(exc, KeyError) else f"{exc.args[0] if exc.args else exc}"
        if isinstance(exc, RuntimeError) and type(exc).__name__ == "ConvertError":
            return text  # keeps pnnx's own output under its first line
        return " ".join(line.strip() for line in text.splitlines() if line.strip())
    return None


EXPORT_MODULES = ("torch", "transformers", "pnnx")
EXPORT_HINT = "pip install 'ncnnport[export]'"
EXPORT_VERBS = frozenset({"export", "convert", "parity", "bench", "bench-cpp", "nightly", "pack"})


def needs_export(args: argparse.Namespace) -> bool:
    """Whether a parsed command builds, traces or converts the reference (the ``export`` extra):
    the export verbs, ``pack`` (it converts when needed), ``run``/``check`` of a model's build
    rather than a given package, and ``isa-replay dump`` (torch reference cases)."""
    if args.verb in EXPORT_VERBS:
        return True
    if args.verb in ("run", "check"):
        return args.package is None
    return args.verb == "isa-replay" and args.step == "dump"


def importable(name: str) -> bool:
    """Whether ``import name`` would find a module, without importing it (a meta-path hook that
    refuses the name counts as not installed)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def missing_export_line(verb: str) -> str | None:
    """The one line for a verb run on the base distribution alone: which export modules are
    missing and the install command; None when all are there."""
    missing = [m for m in EXPORT_MODULES if not importable(m)]
    if not missing:
        return None
    return (f"ncnnport {verb}: error: needs the export extra ({', '.join(missing)} not installed); "
            f"{EXPORT_HINT} (run --package and verify need only the base install)")


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Parse ``argv``; only ``test`` passes unknown arguments on (to pytest)."""
    if argv and argv[0] == "test":
        return build_parser().parse_known_args(argv)
    run_model = _run_model(argv) if argv and argv[0] == "run" else None
    return build_parser(run_model).parse_args(argv), []


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = _parse(argv)
    if args.verb == "test":
        return cmd_test(args, extra)
    handler = {"export": cmd_export, "convert": cmd_convert, "parity": cmd_parity, "run": cmd_run,
               "report": cmd_report, "check": cmd_check, "bench": cmd_bench,
               "nightly": cmd_nightly, "bench-package": cmd_bench_package,
               "bench-cpp": cmd_bench_cpp,
               "isa-replay": cmd_isa_replay, "verify": cmd_verify, "pack": cmd_pack}[args.verb]
    if needs_export(args) and (line := missing_export_line(args.verb)) is not None:
        say(line, sys.stderr)
        return 2
    from ncnnport.convert.pnnx_runner import Terminated
    try:
        return handler(args)
    except KeyboardInterrupt:
        say(f"ncnnport {args.verb}: interrupted", sys.stderr)
        return 130
    except Terminated:
        say(f"ncnnport {args.verb}: terminated", sys.stderr)
        return 143
    except Exception as exc:  # noqa: BLE001 - user errors become one line, bugs keep their traceback
        line = user_error(exc)
        if line is None or os.environ.get("NCNNPORT_DEBUG"):
            raise
        say(f"ncnnport {args.verb}: error: {line} (NCNNPORT_DEBUG=1 for the traceback)", sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
