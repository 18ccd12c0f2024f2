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
from transformers import Qwen3ASRConfig, Qwen3ASRForConditionalGeneration

from ncnnport.lazy_weights import (LazyModel, SafetensorsSource, SeededSource, WeightSource, empty_module,
                                   materialize, parameter_shapes)

EMBED = "model.language_model.embed_tokens.weight"
HEAD = "lm_head.weight"


class LazyQwen3ASR(LazyModel):
    model_name = "Qwen3ASRForConditionalGeneration"
    OWN = ("config", "source", "skeleton", "generation_config")

    def __init__(self, config: Qwen3ASRConfig, source: WeightSource, *, strict_folder: Path | None = None) -> None:
        from ncnnport.models.qwen3_asr.checkpoint import CheckpointError

        self.error_type = CheckpointError
        self.config = config
        self._strict_folder = strict_folder
        super().__init__(empty_module(lambda: Qwen3ASRForConditionalGeneration(config)).eval(), source)
        self.generation_config = self.skeleton.generation_config

    def _build_full(self) -> Qwen3ASRForConditionalGeneration:
        if self._strict_folder is not None:
            from ncnnport.models.qwen3_asr.checkpoint import load_checkpoint
            return load_checkpoint(self._strict_folder)[0]
        model = materialize(self.skeleton, self.source, "")
        if self.config.tie_word_embeddings:
            model.tie_weights()
        return model.float().eval()


def seeded(config: Qwen3ASRConfig, seed: int) -> LazyQwen3ASR:
    """``config`` with seeded per-tensor weights (the real preset's recipe at any dims)."""
    from ncnnport.models.qwen3_asr.presets import seeded_init_rule

    skeleton = empty_module(lambda: Qwen3ASRForConditionalGeneration(config))
    aliases = {HEAD: EMBED} if config.tie_word_embeddings else {}
    source = SeededSource(parameter_shapes(skeleton), seeded_init_rule(skeleton), seed=seed, aliases=aliases)
    return LazyQwen3ASR(config, source)


def _folder_names(folder: Path, config: Qwen3ASRConfig) -> tuple[dict[str, str], dict[str, str]]:
    """(aliases: transformers name -> name stored in the folder, stored name -> transformers
    name). The transformers layout stores its own names (a tied head absent from the file is read
    from the embedding); the official layout is renamed through the declared table (its explicit
    head is read as stored; the strict full load checks it equals the embedding when tied), and
    its unmapped names are unexpected tensors."""
    from ncnnport.lazy_weights import weight_files
    from ncnnport.models.qwen3_asr.checkpoint import (CheckpointError, _fmt_keys, is_official_folder,
                                                      official_name_map)

    stored = list(weight_files(folder))
    if not is_official_folder(folder):
        aliases = {HEAD: EMBED} if config.tie_word_embeddings else {}
        return aliases, {n: n for n in stored}
    mapping, unmapped = official_name_map(stored)
    if unmapped:
        raise CheckpointError(f"checkpoint (official layout) has unexpected {len(unmapped)} tensor(s): "
                              f"{_fmt_keys(unmapped)}")
    if config.tie_word_embeddings and HEAD not in mapping and EMBED in mapping:
        mapping[HEAD] = mapping[EMBED]
    return mapping, {old: new for new, old in mapping.items() if new != HEAD or old != mapping.get(EMBED)}


def from_folder(folder: Path, config: Qwen3ASRConfig, *, truncated: bool) -> LazyQwen3ASR:
    """A local checkpoint folder (transformers or official layout) read per module. Untruncated,
    the full reference is the strict loader's (unexpected tensors are errors); truncated to K
    layers, the extra layers' tensors are expected and simply never read."""
    aliases, hf_name = _folder_names(folder, config)
    source = SafetensorsSource(folder, aliases=aliases)
    if not truncated:
        skeleton_names = set(parameter_shapes(empty_module(lambda: Qwen3ASRForConditionalGeneration(config))))
        unexpected = {n for n, h in hf_name.items() if h not in skeleton_names}
        if unexpected:
            from ncnnport.models.qwen3_asr.checkpoint import CheckpointError, _fmt_keys
            raise CheckpointError(f"checkpoint does not match Qwen3ASRForConditionalGeneration: unexpected "
                                  f"{len(unexpected)} tensor(s): {_fmt_keys(unexpected)}")
    return LazyQwen3ASR(config, source, strict_folder=None if truncated else folder)
