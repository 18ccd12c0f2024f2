"""Graph names of the Qwen3-ASR split, torch-free: the runtime loop needs them without the
wrappers that ``specs`` imports (``ncnnport run --package`` runs where torch is absent)."""

from __future__ import annotations

from typing import Mapping


def layer_names(d: Mapping[str, int]) -> dict[str, list[str]]:
    """Graph names per layer, in execution order (the runtime and the parity report use them)."""
    return {
        "audio": [f"audio_layer{i}" for i in range(d["audio_layers"])],
        "prefill": [f"prefill_layer{i}" for i in range(d["layers"])],
        "decode": [f"decode_layer{i}" for i in range(d["layers"])],
    }
