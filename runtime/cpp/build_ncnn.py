#!/usr/bin/env python3
"""Build the pinned ncnn from its PyPI sdist once, static, into a cache keyed by version + options.

Why a script of our own: the C++ runtime must link the same ncnn release the Python loop uses
(``ncnn==NCNN_VERSION``), CI has only apt and PyPI, and a full ncnn build (every layer, every x86
ISA copy) takes over 30 minutes on a 2-core machine. So this script

* fetches the sdist with pip (pinned URL + sha256: the sdist's setup.py stamps *today's* date as
  its version, so ``pip download ncnn==1.0.20261020`` rejects its own file),
* keeps only the layer types our packages use (``ncnn_layers.txt``) plus every layer those layers
  or ncnn's core create internally (closure found by scanning the sources for ``LayerType::X``),
* keeps the x86 runtime-dispatch copies the wheel dispatches to on current CPUs: AVX/FMA/F16C/AVX2,
  AVX-512 with its VNNI/BF16/FP16 copies, AVX-VNNI (``--isa avx2`` drops every AVX-512 and VNNI
  copy, ``--isa all`` also keeps AMD's FMA4 and XOP),
* builds in a temporary folder and renames it into ``~/.cache/ncnnport/ncnn-<version>-<hash>/``
  only after ``cmake --install`` succeeded, so a failed build never leaves a half cache.

The hash covers the version, the sdist sha256, the requested layer list, the ISA set, Vulkan on/off,
the exact CMake arguments and the compiler: any change is a different folder.
Standard library only: it runs before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

NCNN_VERSION = "1.0.20261020"
SDIST_URL = ("https://files.pythonhosted.org/packages/b7/50/"
             "32b5172afe7d3e0dce410b7d8f4a5b7b84b942a0d69affbaedf669de52bc/ncnn-1.0.20261020.tar.gz")
SDIST_SHA256 = "ad8cdd63e9755cfa8e23b9b6d9ce46156077d80298a89e7c3ba325ffccfca200"
HERE = Path(__file__).resolve().parent
LAYERS_FILE = HERE / "ncnn_layers.txt"
STAMP = "ncnnport-build.json"
APT_PACKAGES = ("cmake", "g++", "make", "pkg-config", "nlohmann-json3-dev", "libssl-dev", "libpcre2-dev",
                "libicu-dev", "libzip-dev", "libpng-dev", "libjpeg-dev", "libsndfile1-dev", "libsoxr-dev",
                "libfftw3-dev")
# Cross targets: a CMake toolchain file under runtime/cpp/toolchains/, the Debian cross compiler,
# the target's -dev packages from Debian multiarch (`dpkg --add-architecture`: the same library
# versions as the host's, no hand-built sysroot) and qemu-user to run what was built.
CROSS_TARGETS = {
    "aarch64": {"toolchain": "aarch64-linux-gnu.cmake", "cxx": "aarch64-linux-gnu-g++", "dpkg_arch": "arm64",
                "apt": ("g++-aarch64-linux-gnu", "qemu-user", "nlohmann-json3-dev", "libssl-dev:arm64",
                        "libpcre2-dev:arm64", "libicu-dev:arm64", "libzip-dev:arm64", "libpng-dev:arm64",
                        "libjpeg-dev:arm64", "libsndfile1-dev:arm64", "libsoxr-dev:arm64", "libfftw3-dev:arm64")},
}
TARGETS = ("host", *CROSS_TARGETS)
TOOLCHAINS = HERE / "toolchains"
# ISA copies ncnn compiles for runtime dispatch. "avx2" (x86) keeps what every x86-64 server since
# Haswell dispatches to for fp32/fp16 (the FMA copy, built with -mfma -mf16c) and drops the rest.
# "armv82" (aarch64) keeps NEON (always on: aarch64's baseline) and the Armv8.2 fp16 copy (asimdhp:
# what fp16 storage/arithmetic use on phones and Graviton 2+), and drops the int8 dot-product,
# bf16-dot, i8mm and SVE copies: the packages run fp32/fp16/bf16 storage, never int8 or SVE kernels.
ISA_OFF = {
    "avx2": ("NCNN_FMA4", "NCNN_XOP", "NCNN_AVXVNNI", "NCNN_AVXVNNIINT8", "NCNN_AVXVNNIINT16",
             "NCNN_AVXNECONVERT", "NCNN_AVX512", "NCNN_AVX512VNNI", "NCNN_AVX512BF16",
             "NCNN_AVX512FP16"),
    # Every copy the PyPI wheel dispatches to on a CPU of the last decade: AVX-512 (F/CD/BW/DQ/VL)
    # and its VNNI / BF16 / FP16 copies, AVX-VNNI and its INT8 / INT16 / NE-CONVERT copies; only
    # AMD's pre-Zen FMA4 and XOP stay off. Why all of them: ncnn dispatches per CPU, so a copy the
    # wheel has and this build lacks runs other kernels there. Without the AVX512BF16 copy a
    # `--precision bf16` run on an AVX-512 BF16 CPU (Zen 4, Xeon since Cooper Lake) took ncnn's
    # generic bf16 path, with other bits than the Python loop's (tokens parted at 17 of 40) and
    # without the bf16 dot products the vision encoder's speed rests on; int8-weights likewise
    # ran another int8 Gemm than the wheel's VNNI one.
    "avx512": ("NCNN_FMA4", "NCNN_XOP"),
    "all": (),
    "armv82": ("NCNN_ARM82DOT", "NCNN_ARM82FP16FML", "NCNN_ARM84BF16", "NCNN_ARM84I8MM", "NCNN_ARM86SVE",
               "NCNN_ARM86SVE2", "NCNN_ARM86SVEBF16", "NCNN_ARM86SVEI8MM", "NCNN_ARM86SVEF32MM"),
}
# The ISA sets each target may build (the first is its default).
TARGET_ISAS = {"host": ("avx512", "avx2", "all"), "aarch64": ("armv82", "all")}
BASE_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DNCNN_SHARED_LIB=OFF", "-DNCNN_BUILD_TOOLS=OFF",
    "-DNCNN_BUILD_EXAMPLES=OFF", "-DNCNN_BUILD_BENCHMARK=OFF", "-DNCNN_BUILD_TESTS=OFF",
    "-DNCNN_PYTHON=OFF", "-DNCNN_OPENMP=ON", "-DNCNN_SIMPLEVK=ON", "-DNCNN_INSTALL_SDK=ON",
)


class BuildError(RuntimeError):
    """A failure the user can act on; printed as one line, no traceback."""


def log(msg: str) -> None:
    """Progress goes to stderr: stdout carries only the install folder (for make)."""
    print(f"[build_ncnn] {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    """``$NCNNPORT_CACHE`` or ``~/.cache/ncnnport`` (tests point it elsewhere)."""
    return Path(os.environ.get("NCNNPORT_CACHE", Path.home() / ".cache" / "ncnnport"))


def read_layer_list(path: Path = LAYERS_FILE) -> list[str]:
    """Layer class names, one a line; ``#`` starts a comment. Sorted, unique."""
    if not path.is_file():
        raise BuildError(f"{path}: layer list missing")
    names = set()
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", line):
            raise BuildError(f"{path}:{lineno}: not a layer type name: {line!r}")
        names.add(line)
    return sorted(names)


# ---------------------------------------------------------------------------------------------
# apt

def apt_packages(target: str = "host") -> tuple[str, ...]:
    """The Debian packages a build for ``target`` needs (host builds: the host's alone)."""
    return APT_PACKAGES if target == "host" else APT_PACKAGES + CROSS_TARGETS[target]["apt"]


def missing_apt_packages(packages: tuple[str, ...] = APT_PACKAGES) -> list[str]:
    """Debian packages not installed (dpkg-query); every one of them when dpkg is absent."""
    missing = []
    for pkg in packages:
        res = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True,
                             text=True, check=False) if shutil.which("dpkg-query") else None
        if res is None or "install ok installed" not in res.stdout:
            missing.append(pkg)
    return missing


def ensure_apt_packages(target: str = "host") -> None:
    """Install missing build packages the way CI must: ``apt-get update`` then ``install -y``
    (a cross target first adds its Debian architecture, so its ``:arch`` -dev packages exist)."""
    missing = missing_apt_packages(apt_packages(target))
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise BuildError(f"missing Debian packages {' '.join(missing)}; install them: "
                         f"apt-get install -y {' '.join(missing)}")
    log(f"apt-get install -y {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmds = [["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]]
    if target != "host":
        cmds.insert(0, ["dpkg", "--add-architecture", CROSS_TARGETS[target]["dpkg_arch"]])
    for cmd in cmds:
        if subprocess.run(cmd, env=env, stdout=sys.stderr, check=False).returncode != 0:
            raise BuildError(f"{' '.join(cmd)} failed")


# ---------------------------------------------------------------------------------------------
# options and cache key

def compiler_id(target: str = "host") -> str:
    """First line of ``c++ --version`` (the target's cross compiler for a cross build): a compiler
    upgrade is a different cache entry."""
    cxx = os.environ.get("CXX", "c++") if target == "host" else CROSS_TARGETS[target]["cxx"]
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return "none"
    return out.splitlines()[0] if out else "unknown"


def toolchain_file(target: str) -> Path:
    """The CMake toolchain file of a cross target."""
    if target not in CROSS_TARGETS:
        raise BuildError(f"--target {target}: choose one of {', '.join(TARGETS)}")
    path = TOOLCHAINS / CROSS_TARGETS[target]["toolchain"]
    if not path.is_file():
        raise BuildError(f"{path}: toolchain file missing")
    return path


def default_isa(target: str) -> str:
    return TARGET_ISAS[target][0]


def build_options(layers: list[str], vulkan: bool, isa: str, target: str = "host") -> dict:
    """Everything that changes the installed library; its hash names the cache folder.

    A host build's options have no target keys, so the x86 cache entries made before cross
    targets existed keep their names; a cross build adds the target and its toolchain file's
    sha256 (an edited toolchain is a different library)."""
    if target not in TARGET_ISAS:
        raise BuildError(f"--target {target}: choose one of {', '.join(TARGETS)}")
    if isa not in TARGET_ISAS[target]:
        raise BuildError(f"--isa {isa}: for target {target} choose one of {', '.join(TARGET_ISAS[target])}")
    # ncnn's CMakeLists stamps the build date as its version unless NCNN_VERSION is given: pin it
    # to the release, so ncnn_version() says 1.0.20261020 and two builds are the same library.
    cmake_args = [*BASE_CMAKE_ARGS, f"-DNCNN_VERSION={NCNN_VERSION.rsplit('.', 1)[1]}",
                  f"-DNCNN_VULKAN={'ON' if vulkan else 'OFF'}",
                  *(f"-D{opt}=OFF" for opt in ISA_OFF[isa])]
    options = {"version": NCNN_VERSION, "sdist_sha256": SDIST_SHA256, "layers": layers,
               "vulkan": vulkan, "isa": isa, "cmake_args": cmake_args, "compiler": compiler_id(target)}
    if target != "host":
        # the toolchain by content, not by path: a key holding the checkout's location would
        # miss the cache from every other clone (CI clones afresh)
        options.update(target=target, toolchain_sha256=sha256_of(toolchain_file(target)))
    return options


def configure_args(options: dict) -> list[str]:
    """The key's CMake arguments plus the toolchain file of a cross target (from this checkout)."""
    args = list(options["cmake_args"])
    if "target" in options:
        args.append(f"-DCMAKE_TOOLCHAIN_FILE={toolchain_file(options['target'])}")
    return args


def options_hash(options: dict) -> str:
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:12]


def install_dir(options: dict) -> Path:
    """``ncnn-<version>-<hash>`` for the host, ``ncnn-<version>-<target>-<hash>`` for a cross target."""
    target = f"{options['target']}-" if "target" in options else ""
    return cache_root() / f"ncnn-{options['version']}-{target}{options_hash(options)}"


def cached(prefix: Path, options: dict) -> bool:
    """A finished install: its stamp exists and records the same options."""
    stamp = prefix / STAMP
    if not stamp.is_file():
        return False
    try:
        return json.loads(stamp.read_text()).get("options") == options
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------
# sdist

def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_sdist() -> Path:
    """The pinned sdist, downloaded once by pip into the cache and checked by sha256."""
    dest = cache_root() / "sdist"
    path = dest / f"ncnn-{NCNN_VERSION}.tar.gz"
    if path.is_file() and sha256_of(path) == SDIST_SHA256:
        return path
    dest.mkdir(parents=True, exist_ok=True)
    log(f"pip download ncnn {NCNN_VERSION} sdist")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", "ncnn",
           "-d", str(dest), f"ncnn @ {SDIST_URL}#sha256={SDIST_SHA256}"]
    if subprocess.run(cmd, stdout=sys.stderr, check=False).returncode != 0 or not path.is_file():
        raise BuildError(f"pip download of the ncnn {NCNN_VERSION} sdist failed ({SDIST_URL})")
    if sha256_of(path) != SDIST_SHA256:
        path.unlink()
        raise BuildError(f"{path}: sha256 differs from the pinned {SDIST_SHA256}")
    return path


def unpack(sdist: Path, into: Path) -> Path:
    """Extract regular files and folders only, none leaving ``into`` (checked by hand: Debian 12's
    Python 3.11.2 predates the tarfile "data" filter, which is applied too where it exists)."""
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if member.name.startswith("/") or ".." in parts or not (member.isfile() or member.isdir()):
                raise BuildError(f"{sdist}: refusing archive member {member.name!r}")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:
            tar.extractall(into)  # every member checked above
    roots = [p for p in into.iterdir() if p.is_dir()]
    if len(roots) != 1 or not (roots[0] / "CMakeLists.txt").is_file():
        raise BuildError(f"{sdist}: unexpected sdist layout")
    return roots[0]


# ---------------------------------------------------------------------------------------------
# layer closure

def declared_layers(src: Path) -> list[str]:
    """Every class ncnn can build: the ``ncnn_add_layer(Class ...)`` lines of src/CMakeLists.txt."""
    text = (src / "src" / "CMakeLists.txt").read_text()
    return re.findall(r"^\s*ncnn_add_layer\((\w+)", text, flags=re.M)


def _layer_files(layer_dir: Path, name: str) -> list[Path]:
    """A layer's own sources in every arch folder: ``<name>.*`` and ``<name>_*`` (lower case)."""
    lower = name.lower()
    return [p for p in layer_dir.rglob("*") if p.is_file() and p.suffix in (".h", ".cpp")
            and (p.stem == lower or p.name.startswith(lower + "_"))]


def _referenced_types(files: list[Path], src_root: Path) -> set[str]:
    """``LayerType::X`` names in ``files`` and in every local header they include, transitively."""
    seen: set[Path] = set()
    todo = list(files)
    found: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        text = path.read_text(errors="replace")
        found.update(re.findall(r"LayerType::(\w+)", text))
        for inc in re.findall(r'#include\s+"([^"]+)"', text):
            for base in (path.parent, src_root, src_root / "layer"):
                if (base / inc).is_file():
                    todo.append((base / inc).resolve())
                    break
    return found


def layer_closure(src: Path, wanted: list[str]) -> list[str]:
    """``wanted`` plus every layer that ncnn's core or a kept layer creates by ``LayerType``.

    Missing one of these is not a link error: ncnn's registry holds a null creator and the
    layer that needs it crashes at run time, so the closure is computed, not hand-kept.
    """
    src_root = src / "src"
    declared = set(declared_layers(src))
    unknown = sorted(set(wanted) - declared)
    if unknown:
        raise BuildError(f"{LAYERS_FILE}: not ncnn {NCNN_VERSION} layer types: {', '.join(unknown)}")
    core = [p for p in src_root.iterdir() if p.suffix in (".h", ".cpp")]
    keep = (set(wanted) | _referenced_types(core, src_root)) & declared
    todo = sorted(keep)
    while todo:
        name = todo.pop()
        for dep in _referenced_types(_layer_files(src_root / "layer", name), src_root) & declared:
            if dep not in keep:
                keep.add(dep)
                todo.append(dep)
    return sorted(keep)


def layer_cmake_args(src: Path, keep: list[str]) -> list[str]:
    return [f"-DWITH_LAYER_{name.lower()}={'ON' if name in keep else 'OFF'}"
            for name in declared_layers(src)]


# ---------------------------------------------------------------------------------------------
# build

@contextlib.contextmanager
def build_lock(prefix: Path):
    """One build per cache key at a time: a second `make cpp` waits, then finds the cache."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(prefix.parent / f".{prefix.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_logged(cmd: list[str], log_path: Path, cwd: Path | None = None) -> None:
    """Run at the lowest priority (shared 2-core machines); on failure show the log's tail."""
    with open(log_path, "a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        res = subprocess.run(["nice", "-n", "19", *cmd], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                             check=False)
    if res.returncode != 0:
        tail = "".join(log_path.read_text(errors="replace").splitlines(True)[-25:])
        raise BuildError(f"{cmd[0]} {cmd[1] if len(cmd) > 1 else ''} failed (exit {res.returncode}); "
                         f"log {log_path}\n{tail}")


def build(options: dict, jobs: int) -> Path:
    """Configure, build and install into a temp folder, then rename it to the cache folder."""
    prefix = install_dir(options)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    sdist = fetch_sdist()
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{prefix.name}-", dir=root))
    log_path = root / f"{prefix.name}.log"
    log_path.write_text("")
    try:
        src = unpack(sdist, tmp / "src")
        keep = layer_closure(src, options["layers"])
        log(f"{len(keep)} of {len(declared_layers(src))} layer types (closure of {len(options['layers'])} "
            f"listed); isa={options['isa']} vulkan={options['vulkan']}; log {log_path}")
        bld = tmp / "build"
        # Install prefix = the final folder, staged with DESTDIR: installed cmake files that
        # hold absolute paths (bundled glslang with Vulkan) stay right after the rename.
        run_logged(["cmake", "-S", str(src), "-B", str(bld), f"-DCMAKE_INSTALL_PREFIX={prefix}",
                    *configure_args(options), *layer_cmake_args(src, keep)], log_path)
        run_logged(["cmake", "--build", str(bld), "-j", str(jobs)], log_path)
        staged = tmp / "stage"
        env_cmd = ["env", f"DESTDIR={staged}", "cmake", "--install", str(bld)]
        run_logged(env_cmd, log_path)
        staged_prefix = staged / prefix.relative_to(prefix.anchor)
        (staged_prefix / STAMP).write_text(json.dumps(
            {"options": options, "layers_built": keep, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S")},
            indent=1) + "\n")
        if prefix.exists():  # a stale folder without a valid stamp (options mismatch is a new name)
            shutil.rmtree(prefix)
        os.rename(staged_prefix, prefix)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return prefix


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vulkan", action="store_true", help="build the Vulkan backend (bundled glslang, simplevk)")
    ap.add_argument("--target", default="host", choices=TARGETS,
                    help="host, or a cross target built with its toolchain file (aarch64: Debian's g++-aarch64-linux-gnu)")
    ap.add_argument("--isa", default=None, choices=sorted(ISA_OFF),
                    help="runtime-dispatch copies to build (default: avx2 on the host, armv82 on aarch64)")
    ap.add_argument("--print-toolchain", action="store_true", help="print the target's CMake toolchain file and exit")
    ap.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (default 2)")
    ap.add_argument("--print-prefix", action="store_true", help="print the install folder and exit")
    ap.add_argument("--no-apt", action="store_true", help="do not install missing Debian packages")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.print_toolchain:
            print(toolchain_file(args.target))
            return 0
        if not args.no_apt:
            ensure_apt_packages(args.target)
        options = build_options(read_layer_list(), args.vulkan, args.isa or default_isa(args.target), args.target)
        prefix = install_dir(options)
        if args.print_prefix:
            print(prefix)
            return 0
        if cached(prefix, options):
            log(f"cache hit: {prefix}")
            print(prefix)
            return 0
        with build_lock(prefix):
            if cached(prefix, options):  # built by a concurrent run while this one waited
                log(f"cache hit: {prefix}")
            else:
                start = time.monotonic()
                prefix = build(options, args.jobs)
                log(f"built in {time.monotonic() - start:.0f} s: {prefix}")
        print(prefix)
        return 0
    except BuildError as exc:
        print(f"build_ncnn: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
