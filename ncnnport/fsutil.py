"""Small file helpers shared by every stage: atomic writes, hashing, JSON."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def current_umask() -> int:
    """The process umask (read by setting and restoring it: there is no getter)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_fd(fd: int, data: bytes) -> None:
    """Write ``data`` to ``fd`` and flush it (one seam for tests that simulate a full disk)."""
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _name_the_file(exc: OSError, path: Path) -> OSError:
    """An OSError raised inside a writer often carries no file name (ENOSPC from write());
    name the artifact so the CLI's one-line error says which file could not be written."""
    if exc.filename is None:
        return type(exc)(exc.errno, exc.strerror or str(exc), str(path))
    return exc


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temp file in the same folder and rename: an interrupted run never leaves a
    half-written artifact that a later run would mistake for a finished one.

    ``mkstemp`` creates its file 0600; the artifact gets the mode an ordinary ``open`` would
    give it (0666 minus the umask, 0644 usually), so packages are readable by other users."""
    path = Path(path)
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~current_umask())
        _write_fd(fd, data)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise _name_the_file(exc, path) from exc
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def read_json_object(path: Path, error: type[Exception] = ValueError) -> dict[str, Any]:
    """A JSON file whose top level must be an object (configs, model.json): unreadable, invalid
    or non-object content is one ``error`` line naming the file."""
    path = Path(path)
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise error(f"{path}: unreadable ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise error(f"{path}: expected a JSON object at the top level, got {type(doc).__name__}")
    return doc


def read_json(path: Path) -> Any:
    """Parsed JSON; a file that is not UTF-8 JSON is a ValueError naming the file."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not valid UTF-8 JSON ({exc})") from None


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


# --- one process per build folder ------------------------------------------------------------------
LOCK_NAME = ".lock"
OWNER_NAME = ".lock.owner"
_held: dict[Path, int] = {}  # folders this process holds, with a nesting count (stages nest)


class BuildLocked(RuntimeError):
    """Another process holds the build folder (raised when waiting is not allowed or timed out)."""


def lock_owner(folder: Path) -> str:
    """Who holds ``folder``'s lock, from the owner file its holder wrote ("pid N (command)")."""
    try:
        owner = json.loads((Path(folder) / OWNER_NAME).read_text())
        return f"pid {owner['pid']} ({owner.get('command', '?')})"
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown process"


@contextlib.contextmanager
def build_lock(folder: Path, timeout: float = -1) -> Iterator[None]:
    """Hold ``folder/.lock`` (an OS file lock via ``filelock``: released by the kernel when the
    holder dies, so a crashed run never leaves a stale lock) for the duration of the block.

    A second process on the same folder prints one line naming the holder's pid and waits;
    ``timeout`` seconds (0: fail at once, negative: wait forever) bound the wait, after which
    :class:`BuildLocked` names the holder. Re-entrant within a process.
    """
    from filelock import FileLock, Timeout

    folder = Path(folder).resolve()
    if _held.get(folder):
        _held[folder] += 1
        try:
            yield
        finally:
            _held[folder] -= 1
        return
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(folder / LOCK_NAME), is_singleton=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        holder = lock_owner(folder)
        if timeout == 0:
            raise BuildLocked(f"build folder {folder} is in use by {holder}; "
                              "wait for it or use another --build-dir") from None
        print(f"[ncnnport] build folder {folder} is in use by {holder}; waiting for it "
              f"({'no limit' if timeout < 0 else f'up to {timeout:g} s'})", file=sys.stderr, flush=True)
        try:
            lock.acquire(timeout=timeout)
        except Timeout:
            raise BuildLocked(f"build folder {folder} is still in use by {lock_owner(folder)} "
                              f"after {timeout:g} s") from None
    try:
        write_json(folder / OWNER_NAME, {"pid": os.getpid(), "command": " ".join(sys.argv[:3])})
        _held[folder] = 1
        yield
    finally:
        _held.pop(folder, None)
        (folder / OWNER_NAME).unlink(missing_ok=True)
        lock.release()
