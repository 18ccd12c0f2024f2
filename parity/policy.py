"""Tolerance policy files: one versioned JSON per model with per-module / per-stage gates per
precision mode. Reports name the policy file and its hash, so a loosened gate is visible."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ncnnport.contract import Tolerance
from ncnnport.fsutil import read_json, sha256_file

FP32_DEFAULT = Tolerance(min_cosine=0.999999, max_abs_rel=1e-4)


@dataclass
class Policy:
    path: Path | None
    data: dict[str, Any]

    @classmethod
    def load(cls, path: Path | None) -> "Policy":
        if path is None or not Path(path).is_file():
            return cls(None, {"version": 0, "precisions": {}})
        data = read_json(path)
        if "version" not in data or "precisions" not in data:
            raise ValueError(f"{path}: a policy needs 'version' and 'precisions'")
        return cls(Path(path), data)

    @property
    def sha256(self) -> str | None:
        return sha256_file(self.path) if self.path else None

    def describe(self) -> dict[str, Any]:
        return {"file": self.path.name if self.path else None, "version": self.data.get("version"),
                "sha256": self.sha256}

    def _mode(self, precision: str) -> dict[str, Any]:
        return self.data["precisions"].get(precision, {})

    @staticmethod
    def _tol(raw: dict[str, Any] | None, base: Tolerance) -> Tolerance:
        if not raw:
            return base
        return Tolerance(min_cosine=raw.get("min_cosine", base.min_cosine),
                         max_abs_rel=raw.get("max_abs_rel", base.max_abs_rel),
                         max_abs_floor=raw.get("max_abs_floor", base.max_abs_floor))

    def default(self, precision: str = "fp32") -> Tolerance:
        return self._tol(self._mode(precision).get("default"), FP32_DEFAULT)

    def module(self, name: str, precision: str = "fp32") -> dict[str, Tolerance]:
        """Gates for a module's outputs: ``{"*": default}`` plus any per-output overrides."""
        mode = self._mode(precision)
        base = self.default(precision)
        raw = mode.get("modules", {}).get(name, {})
        out = {"*": self._tol(raw.get("*"), base)}
        for key, val in raw.items():
            if key != "*":
                out[key] = self._tol(val, out["*"])
        return out

    def stage(self, stage: str, precision: str = "fp32") -> Tolerance:
        mode = self._mode(precision)
        return self._tol(mode.get("stages", {}).get(stage), self.default(precision))

    def number(self, key: str, default: float, precision: str = "fp32") -> float:
        """A scalar gate such as ``min_tokens``."""
        return self._mode(precision).get("numbers", {}).get(key, default)

    def trace_gate(self, precision: str = "fp32") -> str:
        """What fails the first-divergence trace: "propagated" (default) or "local" (see
        ``parity.trace``)."""
        return str(self._mode(precision).get("trace", {}).get("gate", "propagated"))

    def token_gate(self, precision: str = "fp32") -> dict[str, Any]:
        """How greedy tokens are judged in this precision mode (default: exact match)."""
        return dict(self._mode(precision).get("tokens", {"mode": "exact"}))
