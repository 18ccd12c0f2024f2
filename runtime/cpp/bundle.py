#!/usr/bin/env python3
"""Bundle the built C++ executables with the shared libraries they need, for a machine without apt.

    python runtime/cpp/bundle.py BUILD_DIR OUT_DIR [--exe NAME]... [--archive] [--max-mib 64]

Why: the executables link ncnn statically but Debian's OpenSSL, ICU, PCRE2, libzip, libpng,
libjpeg, libsndfile, libsoxr, FFTW and libgomp dynamically. A GPU machine that has only the
NVIDIA driver (no apt) lacks those, so the Vulkan build is carried there as

    OUT_DIR/bin/ncnnport-*     the executables of BUILD_DIR
    OUT_DIR/lib/*.so*          every shared library ``ldd`` resolves for them (under its soname),
                               except the ones the target machine must bring itself: glibc (its
                               loader must match the kernel-side libc), libstdc++/libgcc_s (part
                               of every C++ system) and libvulkan (the driver's loader; ncnn's
                               simplevk can also open the driver itself: NCNN_VULKAN_DRIVER)
    OUT_DIR/run                ``OUT_DIR/run ncnnport-cpp version``: sets LD_LIBRARY_PATH to
                               OUT_DIR/lib and execs bin/<name>

and the total size is printed (the carry limit is 64 MiB; a bundle over ``--max-mib`` is an
error). Each executable links its own static ncnn (~8 MB) and ICU's data library alone is 31 MB,
so all five executables plus libraries exceed 64 MiB: ``--exe`` picks some, ``--archive`` also
writes ``OUT_DIR.tar.xz`` (about a quarter of the size; the limit then applies to it; unpack
with ``tar xf``). Standard library only (runs before any virtualenv). Exit 0 ok, 1 a library ldd cannot
resolve or a bundle too large, 2 bad arguments; each error one line.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

# sonames (before ".so") the target machine provides itself: glibc's libraries and loader,
# the C++ runtime and the Vulkan loader
SYSTEM_LIBS = ("libc", "libm", "libpthread", "libdl", "librt", "libutil", "libresolv", "libanl",
               "libnsl", "libBrokenLocale", "libmvec", "ld-linux-x86-64", "ld-linux-aarch64",
               "ld-linux", "libstdc++", "libgcc_s", "libvulkan")
EXECUTABLE_GLOB = "ncnnport-*"
LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(\S+)\s+\(0x[0-9a-f]+\)\s*$")
LDD_MISSING = re.compile(r"^\s*(\S+)\s+=>\s+not found\s*$")
RUN_SCRIPT = """#!/bin/sh
# Runs one bundled executable with the bundled libraries: run NAME [ARGS...]
here=$(dirname "$(readlink -f "$0")")
if [ $# -lt 1 ] || [ ! -x "$here/bin/$1" ]; then
    echo "usage: $0 NAME [ARGS...]; NAME one of: $(ls "$here/bin" | tr '\\n' ' ')" >&2
    exit 2
fi
name=$1
shift
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/bin/$name" "$@"
"""


class BundleError(RuntimeError):
    """A failure the user can act on; printed as one line."""


def is_system_lib(soname: str) -> bool:
    """True for a library the target machine brings (``SYSTEM_LIBS``), by the name before ``.so``."""
    return soname.split(".so", 1)[0] in SYSTEM_LIBS


def is_elf_executable(path: Path) -> bool:
    with open(path, "rb") as f:
        return path.is_file() and os.access(path, os.X_OK) and f.read(4) == b"\x7fELF"


def executables(build_dir: Path, names: list[str] | None = None) -> list[Path]:
    """The ``ncnnport-*`` executables directly in ``build_dir`` (CMake puts them there), or the
    ones ``names`` lists (each must be built)."""
    found = sorted(p for p in build_dir.glob(EXECUTABLE_GLOB) if is_elf_executable(p))
    if not found:
        raise BundleError(f"{build_dir}: no {EXECUTABLE_GLOB} executables (build it first: make cpp [VULKAN=1])")
    if not names:
        return found
    missing = sorted(set(names) - {p.name for p in found})
    if missing:
        raise BundleError(f"{build_dir}: no executable {', '.join(missing)} (built: {', '.join(p.name for p in found)})")
    return [p for p in found if p.name in names]


def shared_libs(exe: Path) -> dict[str, Path]:
    """``soname -> resolved path`` of every library ``ldd`` lists for ``exe`` that is not a
    system one; an unresolved library is an error naming it."""
    res = subprocess.run(["ldd", str(exe)], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise BundleError(f"{exe}: ldd failed: {(res.stderr or res.stdout).strip().splitlines()[-1:]}")
    libs: dict[str, Path] = {}
    for line in res.stdout.splitlines():
        missing = LDD_MISSING.match(line)
        if missing:
            raise BundleError(f"{exe}: ldd cannot resolve {missing.group(1)}")
        found = LDD_LINE.match(line)
        if found and not is_system_lib(found.group(1)):
            libs[found.group(1)] = Path(found.group(2))
    return libs


def copy_file(src: Path, dest: Path) -> int:
    """Copy the file ``src`` points to (symlinks followed) to ``dest``; its size in bytes."""
    shutil.copyfile(src, dest, follow_symlinks=True)
    os.chmod(dest, stat.S_IMODE(src.stat().st_mode) | stat.S_IRUSR)
    return dest.stat().st_size


def write_run_script(out_dir: Path) -> Path:
    script = out_dir / "run"
    script.write_text(RUN_SCRIPT)
    script.chmod(0o755)
    return script


def bundle(build_dir: Path, out_dir: Path, names: list[str] | None = None) -> tuple[list[str], list[str], int]:
    """(executables, libraries, total bytes) of a fresh bundle of ``build_dir`` in ``out_dir``."""
    if not build_dir.is_dir():
        raise BundleError(f"{build_dir}: no such build folder")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise BundleError(f"{out_dir}: exists and is not empty (choose a new folder)")
    exes = executables(build_dir, names)
    libs: dict[str, Path] = {}
    for exe in exes:
        libs.update(shared_libs(exe))
    (out_dir / "bin").mkdir(parents=True, exist_ok=True)
    (out_dir / "lib").mkdir(exist_ok=True)
    total = sum(copy_file(exe, out_dir / "bin" / exe.name) for exe in exes)
    total += sum(copy_file(path, out_dir / "lib" / soname) for soname, path in sorted(libs.items()))
    total += write_run_script(out_dir).stat().st_size
    return [e.name for e in exes], sorted(libs), total


def archive(out_dir: Path) -> Path:
    """``OUT_DIR.tar.xz`` holding ``OUT_DIR``'s folder (regular files and folders only)."""
    dest = out_dir.with_name(out_dir.name + ".tar.xz")
    with tarfile.open(dest, "w:xz", preset=6) as tar:
        tar.add(out_dir, arcname=out_dir.name)
    return dest


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build_dir", type=Path, help="e.g. build/cpp-vulkan")
    ap.add_argument("out_dir", type=Path, help="a new or empty folder")
    ap.add_argument("--exe", action="append", default=None, metavar="NAME",
                    help="bundle only this executable (repeatable; default: every ncnnport-*)")
    ap.add_argument("--archive", action="store_true", help="also write OUT_DIR.tar.xz; the size limit applies to it")
    ap.add_argument("--max-mib", type=float, default=64.0, help="fail when the bundle is larger (default 64)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        exes, libs, total = bundle(args.build_dir, args.out_dir, args.exe)
        packed = archive(args.out_dir) if args.archive else None
    except (BundleError, OSError) as exc:
        print(f"bundle: {exc}", file=sys.stderr)
        return 1
    print(f"{args.out_dir}: {len(exes)} executables ({', '.join(exes)}), {len(libs)} libraries ({', '.join(libs)}); "
          f"total {total} bytes ({total / 2 ** 20:.1f} MiB)")
    if packed is not None:
        print(f"{packed}: {packed.stat().st_size} bytes ({packed.stat().st_size / 2 ** 20:.1f} MiB)")
    print(f"run: {args.out_dir / 'run'} {exes[0]} ...")
    carried = packed or args.out_dir
    size = packed.stat().st_size if packed is not None else total
    if size / 2 ** 20 > args.max_mib:
        print(f"bundle: {carried} is {size / 2 ** 20:.1f} MiB, over the {args.max_mib:g} MiB limit "
              "(fewer --exe, or --archive)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
