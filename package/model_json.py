"""``model.json``: what a runtime loop needs beside the graphs, written at convert time.

Why: a package must be usable where neither PyTorch nor transformers is installed, so dims,
special ids, RoPE rules, prompt pieces, generation defaults and preprocessing constants are read
from the reference once (by the port's ``runtime_description`` hook) and stored here, versioned.
A reader refuses a package of another model, a missing file and a schema newer than it knows,
each in one line naming the file and field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ncnnport.fsutil import read_json_object, write_json

MODEL_JSON = "model.json"
SCHEMA_VERSION = 1


class PackageError(ValueError):
    """A package that cannot be used as it is (names the file and, where there is one, the field)."""


def write_model_json(root: Path, model: str, description: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``model.json`` under ``root``: the port's description with schema and model name."""
    if "model" in description or "schema_version" in description:
        raise ValueError(f"{model}: runtime_description must not set 'model' or 'schema_version'")
    doc = {"schema_version": SCHEMA_VERSION, "model": model, **description}
    write_json(Path(root) / MODEL_JSON, doc)
    return doc


def read_model_json(root: Path, expected_model: str | None = None) -> dict[str, Any]:
    """The package's ``model.json`` checked: present, a JSON object, a schema this code reads,
    the model ``expected_model`` (when given), and every file its ``files`` map names present."""
    path = Path(root) / MODEL_JSON
    if not path.is_file():
        raise PackageError(f"{path}: missing (the package cannot run without torch: built before model.json "
                           "existed, or its model has no torch-free runtime yet)")
    doc = read_json_object(path, PackageError)
    version = doc.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise PackageError(f"{path}: field 'schema_version' must be an integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise PackageError(f"{path}: field 'schema_version' is {version}, newer than this ncnnport reads "
                           f"({SCHEMA_VERSION}); upgrade ncnnport")
    model = doc.get("model")
    if expected_model is not None and model != expected_model:
        raise PackageError(f"{path}: field 'model' is {model!r}: a package of another model, not {expected_model!r}")
    for role, rel in (doc.get("files") or {}).items():
        if not isinstance(rel, str) or not (Path(root) / rel).is_file():
            raise PackageError(f"{Path(root) / str(rel)}: missing ({role} named by {path} field 'files')")
    return doc
