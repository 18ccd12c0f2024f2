"""Every registered model carries what the generic stages and CI rely on: a tolerance policy, a
tiny preset (the default of every command and of ``make parity``), an end-to-end parity test
through the generic driver, and a row in the README's models table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from ncnnport.registry import KNOWN_MODELS

ROOT = Path(__file__).resolve().parents[1]


def model_folder(name: str) -> Path:
    """The model's source folder, found without importing it (torch-free)."""
    spec = importlib.util.find_spec(KNOWN_MODELS[name].rsplit(".", 1)[0])
    assert spec is not None and spec.origin, f"model {name}: package {KNOWN_MODELS[name]} is not installed"
    return Path(spec.origin).parent


def e2e_test_files(folder_name: str) -> list[str]:
    """Test files of a model that run the generic parity driver on it."""
    tests = ROOT / "tests" / "models" / folder_name
    return sorted(p.name for p in tests.glob("test_*.py") if "run_parity(" in p.read_text())


@pytest.mark.parametrize("name", list(KNOWN_MODELS))
def test_model_has_a_policy(name: str) -> None:
    policy = model_folder(name) / "policy.json"
    assert policy.is_file(), f"model {name}: {policy} is missing"
    assert isinstance(json.loads(policy.read_text()), dict)


@pytest.mark.parametrize("name", list(KNOWN_MODELS))
def test_model_has_a_tiny_preset(name: str) -> None:
    from ncnnport.registry import get_port

    assert "tiny" in get_port(name).presets, f"model {name}: no 'tiny' preset"


@pytest.mark.parametrize("name", list(KNOWN_MODELS))
def test_model_has_an_e2e_parity_test(name: str) -> None:
    folder = model_folder(name).name
    assert e2e_test_files(folder), f"model {name}: no tests/models/{folder}/test_*.py calls run_parity("


@pytest.mark.parametrize("name", list(KNOWN_MODELS))
def test_model_has_a_readme_row(name: str) -> None:
    rows = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith(f"| `{name}` ")]
    assert rows, f"model {name}: no row starting with | `{name}` in README.md's models table"
