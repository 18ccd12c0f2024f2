"""``model.json``: what a runtime loop needs beside the graphs, written at convert time.

Why: a package must be usable where neither PyTorch nor transformers is installed, so dims,
special ids, RoPE rules, prompt pieces, generation defaults and preprocessing constants are read
from the reference once (by the port's ``runtime_description`` hook) and stored here, versioned.
A reader refuses a package of another model, a missing file and a schema newer than it knows,
each in one line naming the file and field.

``precision`` names the weights the package holds (a ``runtime.precision`` name: ``fp32``, or a
derived package's ``fp16-weights`` / ``int8-weights``), so ``verify`` judges its golden vectors by
that precision's budgets instead of the fp32 gates; a package written before the field reads as fp32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ncnnport.fsutil import read_json_object, write_json

MODEL_JSON = "model.json"
SCHEMA_VERSION = 1
# the runtime.precision names a package's weights can be in (the others are ncnn run-time options)
PACKAGE_PRECISIONS = ("fp32", "fp16-weights", "int8-weights")
DEFAULT_PRECISION = "fp32"  # a model.json without the field: written before derived packages said theirs


class PackageError(ValueError):
    """A package that cannot be used as it is (names the file and, where there is one, the field)."""


def write_model_json(root: Path, model: str, description: Mapping[str, Any],
                     precision: str = DEFAULT_PRECISION) -> dict[str, Any]:
    """Write ``model.json`` under ``root``: the port's description with schema, model name and
    the precision of the package's weights."""
    if any(k in description for k in ("model", "schema_version", "precision")):
        raise ValueError(f"{model}: runtime_description must not set 'model', 'schema_version' or 'precision'")
    if precision not in PACKAGE_PRECISIONS:
        raise ValueError(f"{model}: package precision {precision!r} is not one of {', '.join(PACKAGE_PRECISIONS)}")
    doc = {"schema_version": SCHEMA_VERSION, "model": model, "precision": precision, **description}
    write_json(Path(root) / MODEL_JSON, doc)
    return doc


def set_precision(root: Path, precision: str) -> dict[str, Any]:
    """Rewrite the ``precision`` field of the ``model.json`` under ``root`` (a derived package is
    a copy of the fp32 one whose weights were then rewritten); the other fields are kept."""
    if precision not in PACKAGE_PRECISIONS:
        raise ValueError(f"package precision {precision!r} is not one of {', '.join(PACKAGE_PRECISIONS)}")
    path = Path(root) / MODEL_JSON
    doc = {**read_json_object(path, PackageError), "precision": precision}
    write_json(path, doc)
    return doc


def package_precision(doc: Mapping[str, Any], path: Path) -> str:
    """The precision of a package's weights as its ``model.json`` ``doc`` states it (``fp32``
    when the field is absent: packages from before it); any other value is a PackageError naming
    ``path`` and the field."""
    value = doc.get("precision", DEFAULT_PRECISION)
    if value not in PACKAGE_PRECISIONS:
        raise PackageError(f"{path}: field 'precision' is {value!r}, not one of {', '.join(PACKAGE_PRECISIONS)}")
    return str(value)


def read_package_precision(root: Path) -> str:
    """The package's weight precision from its ``model.json``; ``fp32`` when there is no
    ``model.json`` (a model without a torch-free runtime writes none). A malformed file or field
    is a PackageError naming it."""
    path = Path(root) / MODEL_JSON
    if not path.is_file():
        return DEFAULT_PRECISION
    return package_precision(read_json_object(path, PackageError), path)


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
    package_precision(doc, path)
    for role, rel in (doc.get("files") or {}).items():
        if not isinstance(rel, str) or not (Path(root) / rel).is_file():
            raise PackageError(f"{Path(root) / str(rel)}: missing ({role} named by {path} field 'files')")
    return doc
