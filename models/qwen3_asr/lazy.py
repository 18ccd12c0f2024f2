"""Qwen3-ASR built one submodule at a time from a lazy weight source.

Why: at real size the model is ~3 GB in float32; export needs one layer at a time. A
``LazyQwen3ASR`` holds the config, a parameter-free skeleton of the transformers model (parameters
on ``meta``, buffers real) and a :class:`~ncnnport.lazy_weights.WeightSource`. ``part(path)``
returns a copy of one submodule with its weights read from the source; nothing else is read.
The full transformers model (needed by e2e parity and the torch bench) is built only when asked
for: ``full()``, or any attribute the object does not have itself (``model.generate``,
``model.model.language_model`` ...), so code written against the HF model keeps working.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3ASRConfig, Qwen3ASRForConditionalGeneration

from ncnnport.lazy_weights import (SafetensorsSource, SeededSource, WeightSource, empty_module, materialize,
                                   parameter_shapes)

EMBED = "model.language_model.embed_tokens.weight"
HEAD = "lm_head.weight"


class LazyQwen3ASR:
    def __init__(self, config: Qwen3ASRConfig, source: WeightSource, *, strict_folder: Path | None = None) -> None:
        self.config = config
        self.source = source
        self.skeleton = empty_module(lambda: Qwen3ASRForConditionalGeneration(config)).eval()
        self.generation_config = self.skeleton.generation_config
        self._strict_folder = strict_folder
        self._full: Qwen3ASRForConditionalGeneration | None = None
        self._check_names()

    def _check_names(self) -> None:
        """Every parameter of the skeleton must exist in the source with its shape (a missing
        tensor is an error naming it, never a random init)."""
        missing, bad = [], []
        names = set(self.source.names())
        for name, shape in parameter_shapes(self.skeleton).items():
            if name not in names:
                missing.append(name)
            elif tuple(self.source.shape(name)) != tuple(shape):
                bad.append(f"{name}: source {self.source.shape(name)} vs model {shape}")
        if missing or bad:
            from ncnnport.models.qwen3_asr.checkpoint import CheckpointError, _fmt_keys
            parts = []
            if missing:
                parts.append(f"missing {len(missing)} tensor(s): {_fmt_keys(missing)}")
            if bad:
                parts.append(f"shape mismatch: {'; '.join(bad[:8])}")
            raise CheckpointError(f"{self.source.describe()} does not match Qwen3ASRForConditionalGeneration: "
                                  + " | ".join(parts))

    # --- one module at a time ---------------------------------------------------------------
    def part(self, path: str) -> torch.nn.Module:
        """A copy of submodule ``path`` with its weights read from the source (eval mode)."""
        return materialize(self.skeleton.get_submodule(path), self.source, path).eval()

    def part_bytes(self, path: str) -> int:
        """float32 bytes of submodule ``path``'s parameters (nothing is read)."""
        return self.source.nbytes(path)

    # --- the whole model, on demand ---------------------------------------------------------
    def full(self) -> Qwen3ASRForConditionalGeneration:
        if self._full is None:
            if self._strict_folder is not None:
                from ncnnport.models.qwen3_asr.checkpoint import load_checkpoint
                self._full, _ = load_checkpoint(self._strict_folder)
            else:
                model = materialize(self.skeleton, self.source, "")
                if self.config.tie_word_embeddings:
                    model.tie_weights()
                self._full = model.float().eval()
        return self._full

    @property
    def is_materialized(self) -> bool:
        return self._full is not None

    def __getattr__(self, name: str) -> Any:
        # only reached for attributes this object lacks: delegate to the full HF model
        if name.startswith("_") or name in ("config", "source", "skeleton", "generation_config"):
            raise AttributeError(name)
        return getattr(self.full(), name)


def seeded(config: Qwen3ASRConfig, seed: int) -> LazyQwen3ASR:
    """``config`` with seeded per-tensor weights (the real preset's recipe at any dims)."""
    from ncnnport.models.qwen3_asr.presets import seeded_init_rule

    skeleton = empty_module(lambda: Qwen3ASRForConditionalGeneration(config))
    aliases = {HEAD: EMBED} if config.tie_word_embeddings else {}
    source = SeededSource(parameter_shapes(skeleton), seeded_init_rule(skeleton), seed=seed, aliases=aliases)
    return LazyQwen3ASR(config, source)


def from_folder(folder: Path, config: Qwen3ASRConfig, *, truncated: bool) -> LazyQwen3ASR:
    """A local checkpoint folder read per module. Untruncated, the full reference is the strict
    loader's (unexpected tensors are errors); truncated to K layers, the extra layers' tensors
    are expected and simply never read."""
    aliases = {HEAD: EMBED} if config.tie_word_embeddings else {}
    source = SafetensorsSource(folder, aliases=aliases)
    if not truncated:
        skeleton_names = set(parameter_shapes(empty_module(lambda: Qwen3ASRForConditionalGeneration(config))))
        unexpected = set(source.names()) - skeleton_names
        if unexpected:
            from ncnnport.models.qwen3_asr.checkpoint import CheckpointError, _fmt_keys
            raise CheckpointError(f"checkpoint does not match Qwen3ASRForConditionalGeneration: unexpected "
                                  f"{len(unexpected)} tensor(s): {_fmt_keys(unexpected)}")
    return LazyQwen3ASR(config, source, strict_folder=None if truncated else folder)
