"""Official ``.pth`` weights -> this project's safetensors checkpoint folder, once, with a receipt.

The official SeedVR2 release ships pickles (``seedvr2_ema_3b.pth``, ``ema_vae.pth``). They are
opened only through ``torch.load(weights_only=True)`` (no arbitrary globals, so no code runs),
must be a flat ``{str: floating Tensor}`` mapping, and are written as safetensors into a build
folder next to a receipt (source path, size, sha256, tensor count). Loading then goes through the
strict safetensors path (``lazy.from_folder``) like any checkpoint; the pickle is never read again
while its size and mtime are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch

from ncnnport.fsutil import sha256_file

# role -> file patterns of a checkpoint folder (this project's names, then the official ones)
PTH_ROLES: dict[str, tuple[str, ...]] = {
    "dit": ("dit*.pth", "seedvr2_ema_*.pth"),
    "vae": ("vae*.pth", "ema_vae*.pth"),
    "text": ("text.pth",),
}
RECEIPT = "receipt.json"


def pth_files(folder: Path) -> dict[str, list[Path]]:
    """The ``.pth`` files of a checkpoint folder by role (empty when it holds none)."""
    out: dict[str, list[Path]] = {}
    for role, patterns in PTH_ROLES.items():
        files = sorted({p for pat in patterns for p in Path(folder).glob(pat)})
        if files:
            out[role] = files
    return out


def _restricted_load(path: Path) -> Any:
    """``torch.load(weights_only=True)``, memory-mapped for zip files (torch.save's format since
    1.6, what the official release ships); legacy non-zip pickles cannot be mapped and are read
    whole, through the same restricted unpickler."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):
            raise
        return torch.load(path, map_location="cpu", weights_only=True)


def read_pth(path: Path) -> dict[str, torch.Tensor]:
    """Restricted read: ``weights_only=True`` and a flat mapping of str -> floating tensor.

    Anything else (a pickle needing other globals, a nested dict, a number, an integer tensor)
    is a ValueError naming the file and the offending key."""
    path = Path(path)
    try:
        obj = _restricted_load(path)
    except Exception as e:  # UnpicklingError (a global outside the allow-list), corrupt file, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: refused by the restricted loader (torch.load weights_only=True): {first}") from None
    if not isinstance(obj, Mapping):
        raise ValueError(f"{path}: expected a flat mapping of name -> tensor, got {type(obj).__name__}")
    for k, v in obj.items():
        if not isinstance(k, str):
            raise ValueError(f"{path}: key {k!r} is not a string")
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"{path}: {k} is a {type(v).__name__}, not a tensor (a flat state dict is required)")
        if not v.is_floating_point():
            raise ValueError(f"{path}: {k} has dtype {v.dtype}, only floating tensors are accepted")
    if not obj:
        raise ValueError(f"{path}: holds no tensors")
    return dict(obj)


def _stamp(path: Path) -> dict[str, int]:
    st = Path(path).stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def convert_pth(src: Path, dst: Path) -> dict[str, Any]:
    """``src`` (.pth) -> ``dst`` (.safetensors) plus ``dst``'s receipt entry; skipped when the
    receipt next to ``dst`` says the same source (path, size, mtime) was converted already."""
    from safetensors.torch import save_file

    src, dst = Path(src).resolve(), Path(dst)
    receipt_path = dst.with_suffix(".receipt.json")
    if dst.is_file() and receipt_path.is_file():
        old = json.loads(receipt_path.read_text())
        if old.get("source") == str(src) and {k: old.get(k) for k in ("size", "mtime_ns")} == _stamp(src):
            return old
    state = read_pth(src)
    tmp = dst.with_name(dst.name + ".partial")
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp))
    os.replace(tmp, dst)
    receipt = {"source": str(src), **_stamp(src), "sha256": sha256_file(src), "tensors": len(state),
               "safetensors": dst.name}
    receipt_path.write_text(json.dumps(receipt, indent=2) + "\n")
    return receipt


def safetensors_folder(folder: Path, build_root: Path) -> Path:
    """``folder`` itself when it holds no ``.pth``; else a build folder with ``config.json``,
    converted ``dit/vae/text.safetensors`` (any safetensors of the source linked in) and
    ``receipt.json`` listing every conversion."""
    folder = Path(folder).resolve()
    found = pth_files(folder)
    if not found:
        return folder
    for role, files in found.items():
        if len(files) > 1:
            raise ValueError(f"{folder}: several {role} .pth files ({', '.join(f.name for f in files)}); keep one")
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder / 'config.json'}: missing (a checkpoint folder needs its config.json)")
    key = hashlib.sha256(str(folder).encode()).hexdigest()[:12]
    out = Path(build_root) / "seedvr2" / "checkpoints" / f"{folder.name}-{key}"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(folder / "config.json", out / "config.json")
    for st in folder.glob("*.safetensors"):
        clash = [role for role in found if st.name.startswith(role)]  # FolderSource reads "<role>*.safetensors"
        if clash:
            raise ValueError(f"{folder}: both {st.name} and a {clash[0]} .pth; keep one")
    receipts = {role: convert_pth(files[0], out / f"{role}.safetensors") for role, files in found.items()}
    for st in folder.glob("*.safetensors"):
        link = out / st.name
        if not link.exists():
            link.symlink_to(st)
    (out / RECEIPT).write_text(json.dumps({"source_folder": str(folder), "converted": receipts}, indent=2) + "\n")
    return out
