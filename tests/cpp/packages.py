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


def tiny_precision_package(model: str, precision: str) -> Path:
    """``build/<model>/tiny/package-fp16w`` or ``package-int8w`` (``runtime.precision`` name),
    brought up to date once per test session by the stage ``parity --precision`` uses."""
    from ncnnport.runtime.precision import get
    from ncnnport.stages import precision_package, prepare
    from ncnnport.targets import Target

    key = f"{model}:{precision}"
    if key not in _PACKAGES:
        _PACKAGES[key] = Path(precision_package(prepare(Target(model, "tiny", None)), get(precision)))
    return _PACKAGES[key]
