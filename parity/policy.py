"""Tolerance policy files: one versioned JSON per model with per-module / per-stage gates per
precision mode. Reports name the policy file and its hash, so a loosened gate is visible."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ncnnport.contract import Tolerance
from ncnnport.fsutil import read_json, sha256_file
from ncnnport.parity.budgets import RoundoffRule, derive

# a mode a policy may leave out, judged by the explicit entries (absolute stages) of its parent
MODE_PARENT = {"fp16_arithmetic": "fp16"}

FP32_DEFAULT = Tolerance(min_cosine=0.999999, max_abs_rel=1e-4)


def _check_kappas(raw: dict[str, Any], where: str) -> None:
    """Only kappa_abs / kappa_cos, each a number > 0 (a propagated amplification's fields)."""
    for key, value in raw.items():
        if key not in ("kappa_abs", "kappa_cos") or isinstance(value, bool) \
                or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{where}: {key}={value!r}; only kappa_abs and kappa_cos, numbers > 0")


@dataclass
class Policy:
    path: Path | None
    data: dict[str, Any]
    # The stage names the model's pipeline asks gates for (``ModelPort.policy_stages``); None: not
    # declared, any name is taken. Why declared: ``stage()`` of a name no entry states falls back
    # to the mode's default gate, so a misspelled stage (in the file or in a caller) would be
    # judged by another budget without a word.
    stages: frozenset[str] | None = None
    # The graph names gates are asked for (the specs' names, or a package's graphs); None: any.
    # Why: ``module()`` of a name no entry states gives the default gate too, so a module entry
    # with a misspelled name would never apply and its module would be judged by the default.
    modules: frozenset[str] | None = None

    @classmethod
    def load(cls, path: Path | None, stages: Iterable[str] | None = None,
             modules: Iterable[str] | None = None) -> "Policy":
        """The policy at ``path`` (an empty one where there is no file); with ``stages`` /
        ``modules``, every stage / module the file states must be one of them, and ``stage()`` /
        ``module()`` refuse any other name."""
        known_stages = None if stages is None else frozenset(stages)
        known_modules = None if modules is None else frozenset(modules)
        if path is None or not Path(path).is_file():
            return cls(None, {"version": 0, "precisions": {}}, known_stages, known_modules)
        data = read_json(path)
        if "version" not in data or "precisions" not in data:
            raise ValueError(f"{path}: a policy needs 'version' and 'precisions'")
        policy = cls(Path(path), data, known_stages, known_modules)
        policy._check_rule()
        policy._check_names("stages", policy.stages, "a stage of this model's pipeline")
        policy._check_names("modules", policy.modules, "a graph of this model")
        return policy

    def _stated(self, section: str) -> list[tuple[str, str]]:
        """(where, name) of every entry the file states in ``section`` ("stages" / "modules"):
        under each precision mode and the roundoff rule (for modules, its propagated part too)."""
        rule = self.data.get("roundoff_rule") or {}
        stated = [(f"precisions.{mode}.{section}", name) for mode, body in self.data["precisions"].items()
                  for name in body.get(section, {})]
        stated += [(f"roundoff_rule.{section}", name) for name in rule.get(section, {})]
        if section == "modules":
            stated += [("roundoff_rule.propagated.modules", name)
                       for name in (rule.get("propagated") or {}).get("modules", {})]
        return stated

    def _check_names(self, section: str, known: frozenset[str] | None, what: str) -> None:
        """Every name the file states in ``section`` is in ``known`` (when declared)."""
        if known is None:
            return
        for where, name in self._stated(section):
            if name not in known:
                raise ValueError(f"{self.path}: {where}.{name}: not {what} ({', '.join(sorted(known))})")

    def _refuse_unknown(self, kind: str, name: str, known: frozenset[str] | None, what: str) -> None:
        if known is not None and name not in known:
            raise ValueError(f"policy {self.path.name if self.path else '(none)'}: no {kind} {name!r} in this "
                             f"{what} ({', '.join(sorted(known))})")

    @property
    def rule(self) -> RoundoffRule | None:
        """The model's roundoff rule (``roundoff_rule``), which derives every reduced-precision
        mode's relative gates; None for a policy that states them as numbers."""
        raw = self.data.get("roundoff_rule")
        return None if raw is None else RoundoffRule.from_json(raw, str(self.path or "policy"))

    def _check_rule(self) -> None:
        """With a rule, a reduced mode may only state absolute gates (``max_abs_rel`` 0: host-side
        or byte-exact stages): a relative number there would be a machine-fitted budget again."""
        if self.rule is None:
            return
        propagated = self.data["roundoff_rule"].get("propagated")
        if propagated is not None:
            where = f"{self.path}: roundoff_rule.propagated"
            if not isinstance(propagated, dict) or not propagated:
                raise ValueError(f"{where}: state kappa_abs, kappa_cos and/or modules as an object")
            _check_kappas({k: v for k, v in propagated.items() if k != "modules"}, where)
            modules = propagated.get("modules", {})
            if not isinstance(modules, dict):
                raise ValueError(f"{where}.modules: an object of module -> kappas, got {modules!r}")
            for name, kappas in modules.items():
                if not isinstance(kappas, dict) or not kappas:
                    raise ValueError(f"{where}.modules.{name}: state kappa_abs and/or kappa_cos as an object")
                _check_kappas(kappas, f"{where}.modules.{name}")
        for mode, body in self.data["precisions"].items():
            if mode == "fp32":
                continue
            if "default" in body or "modules" in body:
                raise ValueError(f"{self.path}: precisions.{mode}: 'default'/'modules' are derived from "
                                 f"roundoff_rule; state a module's amplification in roundoff_rule.modules")
            for stage, raw in body.get("stages", {}).items():
                if raw.get("max_abs_rel", 0.0) != 0.0:
                    raise ValueError(f"{self.path}: precisions.{mode}.stages.{stage}: only absolute gates "
                                     f"(max_abs_rel 0) may be stated; relative ones come from roundoff_rule")

    @property
    def sha256(self) -> str | None:
        return sha256_file(self.path) if self.path else None

    def describe(self) -> dict[str, Any]:
        return {"file": self.path.name if self.path else None, "version": self.data.get("version"),
                "sha256": self.sha256}

    def _mode(self, precision: str) -> dict[str, Any]:
        modes = self.data["precisions"]
        if precision not in modes and precision in MODE_PARENT:
            return modes.get(MODE_PARENT[precision], {})
        return modes.get(precision, {})

    def _derived(self, precision: str, section: str = "", name: str = "",
                 propagated: bool = False) -> Tolerance | None:
        """The rule's budget for ``precision`` (with a module's/stage's own kappa; with
        ``propagated``, raised to the rule's propagated amplification), or None."""
        rule = self.rule
        if rule is None or precision == "fp32":
            return None
        raw = self.data["roundoff_rule"]
        rule = rule.override(raw.get(section, {}).get(name) if section else None)
        if propagated:
            prop = raw.get("propagated") or {}
            rule = rule.at_least(prop)
            if section == "modules":
                rule = rule.at_least(prop.get("modules", {}).get(name))
        return derive(rule, precision, self.default("fp32"))

    @staticmethod
    def _tol(raw: dict[str, Any] | None, base: Tolerance) -> Tolerance:
        if not raw:
            return base
        return Tolerance(min_cosine=raw.get("min_cosine", base.min_cosine),
                         max_abs_rel=raw.get("max_abs_rel", base.max_abs_rel),
                         max_abs_floor=raw.get("max_abs_floor", base.max_abs_floor))

    def default(self, precision: str = "fp32") -> Tolerance:
        derived = self._derived(precision)
        return derived if derived is not None else self._tol(self._mode(precision).get("default"), FP32_DEFAULT)

    def module(self, name: str, precision: str = "fp32") -> dict[str, Tolerance]:
        """LOCAL gates for a module's outputs (the module fed the reference's exact inputs: local
        parity, golden vectors, the trace's local check): ``{"*": default}`` plus any per-output
        overrides."""
        self._refuse_unknown("module", name, self.modules, "model's graphs")
        mode = self._mode(precision)
        base = self.default(precision)
        derived = self._derived(precision, "modules", name)
        if derived is not None:
            return {"*": derived}
        raw = mode.get("modules", {}).get(name, {})
        out = {"*": self._tol(raw.get("*"), base)}
        for key, val in raw.items():
            if key != "*":
                out[key] = self._tol(val, out["*"])
        return out

    def propagated_module(self, name: str, precision: str = "fp32") -> dict[str, Tolerance]:
        """Gates for a module's outputs when the module runs on the pipeline's own upstream
        outputs (the first-divergence trace's propagated check): the local gates of
        :meth:`module` where no rule derives them, else the rule raised to its propagated
        amplification."""
        self._refuse_unknown("module", name, self.modules, "model's graphs")
        derived = self._derived(precision, "modules", name, propagated=True)
        return {"*": derived} if derived is not None else self.module(name, precision)

    def stage(self, stage: str, precision: str = "fp32") -> Tolerance:
        """A pipeline stage's gate. Stages are propagated outputs (the pipeline on its own
        intermediate results), so a derived one takes the rule's propagated amplification."""
        self._refuse_unknown("stage", stage, self.stages, "model's pipeline")
        mode = self._mode(precision)
        raw = mode.get("stages", {}).get(stage)
        derived = self._derived(precision, "stages", stage, propagated=True)
        if derived is not None and raw is None:
            return derived
        return self._tol(raw, self.default(precision))

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
