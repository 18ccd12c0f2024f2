"""Package archives: ``pack`` writes one ``.tar.gz`` per package with its sha256 file and a
per-file ``checksums.sha256`` (``sha256sum -c`` format); ``extract_package`` opens one safely.

Why: the package is published as one file with whole-archive and per-file SHA-256, and a
deployer runs ``verify``/``run`` on the archive directly. An archive is untrusted input: a member
with ``..``, an absolute path, a link or anything but a plain file or folder is refused in one
line naming the member, before anything is written.
"""

from __future__ import annotations

import gzip
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from ncnnport.fsutil import sha256_file

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
CHECKSUMS = "checksums.sha256"


def is_archive(path: Path) -> bool:
    return Path(path).is_file() and str(path).endswith(ARCHIVE_SUFFIXES)


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))


def checksums_text(folder: Path, prefix: str) -> str:
    """``<sha256>  <prefix>/<rel>`` per file, as ``sha256sum`` prints it (checkable after unpacking)."""
    return "".join(f"{sha256_file(p)}  {prefix}/{p.relative_to(folder).as_posix()}\n" for p in _files(folder))


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Reproducible members: no owner, fixed mode and time (same package -> same archive bytes)."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    info.mode = 0o755 if info.isdir() else 0o644
    return info


def write_archive(folder: Path, out_dir: Path, name: str) -> Path:
    """``out_dir/<name>.tar.gz`` holding ``folder`` as ``<name>/...``, its ``.sha256`` file and
    ``checksums.sha256`` lines for every file in it (appended: one file for every package)."""
    folder, out_dir = Path(folder), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / f"{name}.tar.gz"
    with tempfile.NamedTemporaryFile(dir=out_dir, prefix=f".{name}.", suffix=".tmp", delete=False) as tmp:
        with gzip.GzipFile(fileobj=tmp, mode="wb", mtime=0, filename="") as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(folder, arcname=name, recursive=False, filter=_reset)
            for p in sorted(folder.rglob("*")):
                if p.name.startswith(".") or p.is_symlink():
                    continue
                tar.add(p, arcname=f"{name}/{p.relative_to(folder).as_posix()}", recursive=False, filter=_reset)
    Path(tmp.name).chmod(0o644)  # a temp file is created 0600; the archive is for publishing
    Path(tmp.name).replace(archive)
    (out_dir / f"{archive.name}.sha256").write_text(f"{sha256_file(archive)}  {archive.name}\n")
    sums = out_dir / CHECKSUMS
    kept = [ln for ln in (sums.read_text().splitlines(True) if sums.is_file() else [])
            if not ln.split("  ", 1)[-1].startswith(f"{name}/")]
    sums.write_text("".join(kept) + checksums_text(folder, name))
    return archive


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why a member may not be extracted (None when it is a plain file or folder inside)."""
    p = PurePosixPath(member.name)
    if p.is_absolute() or member.name.startswith("\\") or (p.parts and ":" in p.parts[0]):
        return "absolute path"
    if ".." in p.parts:
        return "path with '..'"
    if member.issym() or member.islnk():
        return f"link to {member.linkname!r}"
    if not (member.isfile() or member.isdir()):
        return "not a plain file or folder"
    return None


def check_members(archive: Path, members: list[tarfile.TarInfo]) -> str:
    """The single top folder all members live in; any unsafe member is a ``ValueError`` naming it."""
    for m in members:
        why = member_problem(m)
        if why:
            raise ValueError(f"{archive}: refusing member {m.name!r}: {why}")
    tops = {PurePosixPath(m.name).parts[0] for m in members if PurePosixPath(m.name).parts}
    if len(tops) != 1:
        raise ValueError(f"{archive}: a package archive holds one top folder, found {sorted(tops)[:5]}")
    return tops.pop()


def extract_package(archive: Path, dest: Path) -> Path:
    """Extract ``archive`` into ``dest`` after checking every member; returns the package folder."""
    archive = Path(archive)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            top = check_members(archive, members)
            for m in members:
                target = Path(dest) / m.name
                if m.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(m)
                with open(target, "wb") as f:
                    while chunk := src.read(1 << 20):
                        f.write(chunk)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ValueError(f"{archive}: not a readable package archive ({exc})") from None
    return Path(dest) / top

