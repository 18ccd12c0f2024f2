"""Token selection. Greedy is what parity checks; the margin explains a flip."""

from __future__ import annotations

import numpy as np


def greedy(logits: np.ndarray) -> int:
    """Index of the largest logit of a 1-D row (first one on exact ties, as torch.argmax)."""
    row = np.asarray(logits).reshape(-1)
    return int(np.argmax(row))


def top2_margin(logits: np.ndarray) -> float:
    """Gap between the best and second-best logit: how close the step was to a tie."""
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    if row.size < 2:
        return float("inf")
    top = np.partition(row, -2)[-2:]
    return float(top[1] - top[0])


def suppress(logits: np.ndarray, token_ids) -> np.ndarray:
    """Copy of a logit row with ``token_ids`` set to -inf (e.g. EOS before a minimum length)."""
    row = np.array(logits, dtype=np.float32, copy=True).reshape(-1)
    row[list(token_ids)] = -np.inf
    return row
