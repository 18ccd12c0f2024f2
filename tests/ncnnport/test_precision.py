"""One ``--precision`` vocabulary: the same names and meanings in run, parity and the sweep, and
no gate numbers written into a model's code (tolerances come from its policy only)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ncnnport.parity.sweep import variants
from ncnnport.runtime import precision
from ncnnport.runtime.options import RuntimeOptions

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_every_sweep_row_is_a_cli_precision_with_its_options_and_mode() -> None:
    rows = variants(gpu=True)
    assert {v.setting for v in rows} == set(precision.NAMES)
    for v in rows:
        p = precision.get(v.setting)
        mode = precision.judging_mode(p, v.options.use_vulkan)  # Vulkan rows: the Vulkan budgets
        assert (v.precision, v.fp16_weights) == (mode, p.fp16_weights)
        assert v.options == p.options(v.options), v.name  # same flags, caller's threads/backend
    assert {v.precision for v in rows if v.options.use_vulkan} == {"vulkan_fp32", "vulkan_fp16"}


def test_options_keep_the_callers_threads_backend_and_memory_and_reset_other_flags() -> None:
    base = RuntimeOptions(num_threads=3, use_vulkan=True, low_memory=True, fp16_arithmetic=True)
    got = precision.get("bf16").options(base)
    assert (got.num_threads, got.use_vulkan, got.low_memory) == (3, True, True)
    assert got.bf16_storage and not (got.fp16_storage or got.fp16_arithmetic)
    assert precision.of_options(precision.get("fp16-packed").options()).name == "fp16-packed"


def test_unknown_name_is_one_line_naming_the_vocabulary() -> None:
    with pytest.raises(ValueError, match=r"--precision 'fp16': use one of fp32, fp16-storage"):
        precision.get("fp16")


@pytest.mark.parametrize("verb", ["run", "parity", "bench"])
def test_cli_verbs_share_the_vocabulary(verb: str) -> None:
    from ncnnport.cli import build_parser

    argv = [verb, "qwen3-asr"] if verb == "run" else [verb]
    parser = build_parser()
    assert parser.parse_args([*argv, "--precision", "fp16-weights"]).precision == "fp16-weights"
    with pytest.raises(SystemExit):
        parser.parse_args([*argv, "--precision", "fp16"])


def test_model_run_options_do_not_redefine_precision() -> None:
    """A port's run options never carry their own precision spelling (the generic one applies)."""
    import argparse

    from ncnnport.registry import available_models, get_port

    for name in available_models():
        p = argparse.ArgumentParser()
        get_port(name).add_run_arguments(p)
        flags = {s for a in p._actions for s in a.option_strings}
        assert not {f for f in flags if "precision" in f or "fp16" in f or "bf16" in f}, (name, flags)


def _literal_gates(path: Path) -> list[str]:
    """``Tolerance(...)`` calls with a number literal in a model file: a gate that bypasses the
    policy."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Tolerance":
            args = list(node.args) + [k.value for k in node.keywords]
            if not args or any(isinstance(a, ast.Constant) and isinstance(a.value, (int, float)) for a in args):
                out.append(f"{path.relative_to(MODELS)}:{node.lineno}")
    return out


def test_models_write_no_fallback_gates() -> None:
    found = [hit for f in sorted(MODELS.rglob("*.py")) for hit in _literal_gates(f)]
    assert not found, f"gates written in model code instead of policy.json: {found}"

