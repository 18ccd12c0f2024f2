"""Distance of the port to the OFFICIAL qwen-asr package, run in its own venv (a subprocess).

Why: the parity reference is transformers 5.24, which re-implements Qwen3-ASR; the official
package (qwen-asr 0.0.6, transformers 4.57.6) is what the model was published with. When the
environment variable ``NCNNPORT_QWEN_ASR_OFFICIAL_PYTHON`` names that venv's python, this runs
the official ``transcribe()`` on the same fixtures (the model written in the official layout by
``checkpoint.write_official_folder``) and reports per fixture whether the generated token ids
are equal and the first step where they differ. Without it, the check is skipped with a reason.

Known, documented disagreements (measured with this module; see the port's report section):
* the official audio encoder on CPU (sdpa / eager) does not pass its window mask to the
  attention, so audio longer than one attention window (n_window_infer = 800 mel frames, 8 s)
  attends across windows there, while its flash-attention path, its vLLM backend and
  transformers 5.24 keep attention inside each window. The port follows the windowed model.
* for an input under 1 s (one mel chunk) the official encoder convolves only the valid frames,
  where transformers (and the port's fixed 100-frame conv graph) pad the chunk to 100 frames;
  the last post-conv positions then see padding. The port follows transformers here.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

OFFICIAL_PYTHON_ENV = "NCNNPORT_QWEN_ASR_OFFICIAL_PYTHON"
CHILD_SCRIPT = Path(__file__).with_name("official_child.py")
DEFAULT_TIMEOUT_S = 1800


class OfficialReferenceError(RuntimeError):
    """The official package could not be run (bad interpreter, crash, malformed result)."""


def official_python() -> str | None:
    """The official venv's python from the environment, or None when not configured."""
    value = os.environ.get(OFFICIAL_PYTHON_ENV, "").strip()
    return value or None


@dataclass(frozen=True)
class TokenDistance:
    """How far two token-id sequences are: equal, first differing step (None when equal) and
    both lengths."""

    equal: bool
    first_diff: int | None
    ours_len: int
    official_len: int


def token_distance(ours: Sequence[int], official: Sequence[int]) -> TokenDistance:
    """First index where the sequences differ (a length difference counts at the shorter end)."""
    a, b = [int(t) for t in ours], [int(t) for t in official]
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    return TokenDistance(first is None, first, len(a), len(b))


def run_official(python: str, checkpoint: Path, fixtures: Mapping[str, np.ndarray], *, max_new_tokens: int,
                 language: str | None = None, timeout_s: int = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Run ``official_child.py`` under ``python`` on ``fixtures`` (16 kHz mono float32); returns
    its result JSON (``results[name] = {language, text, chunk_token_ids}``)."""
    if not Path(python).is_file():
        raise OfficialReferenceError(f"{OFFICIAL_PYTHON_ENV}={python}: no such interpreter")
    with tempfile.TemporaryDirectory(prefix="qwen3asr-official-") as tmp:
        tmp_dir = Path(tmp)
        paths = {}
        for i, (name, wave) in enumerate(fixtures.items()):
            paths[name] = str(tmp_dir / f"fixture{i}.npy")
            np.save(paths[name], np.asarray(wave, np.float32), allow_pickle=False)
        job = {"checkpoint": str(checkpoint), "fixtures": paths, "max_new_tokens": int(max_new_tokens),
               "language": language}
        job_path, result_path = tmp_dir / "job.json", tmp_dir / "result.json"
        job_path.write_text(json.dumps(job))
        proc = subprocess.run([python, str(CHILD_SCRIPT), str(job_path), str(result_path)],
                              capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise OfficialReferenceError(f"official qwen-asr run failed (exit {proc.returncode}): {tail[0]}")
        try:
            return json.loads(result_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise OfficialReferenceError(f"official qwen-asr run wrote no readable result ({exc})") from exc


def compare_fixture(name: str, ours_chunks: Sequence[Sequence[int]], ours_text: str, ours_language: str | None,
                    official: Mapping[str, Any]) -> dict[str, Any]:
    """One report row: token equality per chunk (the first differing chunk and step named),
    and whether the parsed transcript and language agree."""
    theirs = official["chunk_token_ids"]
    row: dict[str, Any] = {"fixture": name, "stage": "official_reference", "kind": "official",
                           "chunks": len(ours_chunks), "official_chunks": len(theirs),
                           "tokens_equal": len(ours_chunks) == len(theirs), "first_diff_chunk": None,
                           "first_diff_step": None}
    for i, (a, b) in enumerate(zip(ours_chunks, theirs)):
        dist = token_distance(a, b)
        if not dist.equal:
            row.update(tokens_equal=False, first_diff_chunk=i, first_diff_step=dist.first_diff)
            break
    row["text_equal"] = ours_text == official["text"]
    row["language_equal"] = (ours_language or "") == (official["language"] or "")
    row["passed"] = bool(row["tokens_equal"] and row["text_equal"] and row["language_equal"])
    return row


def skipped_row(reason: str) -> dict[str, Any]:
    """The row reported when the official package is not configured."""
    return {"fixture": "*", "stage": "official_reference", "kind": "official", "skipped": True,
            "passed": True, "gated": False, "reason": reason}
