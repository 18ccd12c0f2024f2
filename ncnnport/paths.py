"""Where ncnnport keeps its files: the build folder's default root and the preset cache outside it."""

from __future__ import annotations

import os
from pathlib import Path

# artifacts of every command (``build/<model>/<tag>/``) unless ``--build-dir`` says otherwise
DEFAULT_BUILD_ROOT = Path("build")


def preset_cache_root() -> Path:
    """Seeded presets written as checkpoint folders, shared by every build folder and test run.

    ``NCNNPORT_CACHE`` overrides the default ``~/.cache/ncnnport``; folder names carry a
    fingerprint of the preset recipe, so a changed recipe never reuses a stale folder.
    """
    env = os.environ.get("NCNNPORT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "ncnnport"
