"""The SeedVR2 checkpoint folder as both the built model (``model.py``) and the lazy one
(``lazy.py``) read it: ``config.json`` in this project's format, and parameter selection by name
for partial views. Its own module so neither model imports the other."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ncnnport.fsutil import read_json_object
from ncnnport.models.seedvr2.config import SeedVR2Config

FORMAT = "ncnnport-seedvr2"


def matches(name: str, parts: Sequence[str]) -> bool:
    """Whether parameter ``name`` is one of ``parts`` or lies under one of them."""
    return any(name == p or name.startswith(p + ".") for p in parts)


def read_config(folder: Path) -> SeedVR2Config:
    """A checkpoint folder's ``config.json``: this project's format, every field present."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (a checkpoint folder needs its config.json)")
    meta = read_json_object(path)
    if meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"{path}: format {got!r}, expected {FORMAT!r}")
    if "config" not in meta:
        raise ValueError(f"{path}: field 'config' is missing")
    return SeedVR2Config.from_json(meta["config"], source=str(path))
