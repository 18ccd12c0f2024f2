"""The models' tiny packages for the C++ tests, converted once per session in build/ (convert reuses
an up-to-date one, else builds it)."""

from __future__ import annotations

from pathlib import Path

_PACKAGES: dict[str, Path] = {}


def tiny_package(model: str) -> Path:
    """``build/<model>/tiny/package``, brought up to date once per test session."""
    from ncnnport.stages import convert_stage, prepare
    from ncnnport.targets import Target

    if model not in _PACKAGES:
        _PACKAGES[model] = Path(convert_stage(prepare(Target(model, "tiny", None))))
    return _PACKAGES[model]
