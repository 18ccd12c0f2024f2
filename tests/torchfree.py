"""Helpers for tests of the torch-free paths: a subprocess in which importing torch or
transformers raises (a sitecustomize meta-path hook), and the CLI run in it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BLOCK = '''import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"torch-free path imported {name}")
        return None
sys.meta_path.insert(0, _Block())
'''


def blocking_env(folder: Path) -> dict[str, str]:
    """Environment whose Python raises on ``import torch`` / ``import transformers``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(BLOCK)
    return {**os.environ, "PYTHONPATH": str(folder)}


def cli(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``ncnnport ARGS`` in a subprocess (text output captured)."""
    return subprocess.run([sys.executable, "-m", "ncnnport.cli", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=600)
