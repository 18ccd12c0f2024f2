"""Youtu-VL built one submodule at a time from a lazy weight source.

Why: the real model is ~19.5 GB of float32 (40 MLA layers of 417 MB, a 283386 x 2560 tied
table of 2.9 GB, a 1.6 GB vision tower) and does not fit next to its own ncnn copy in 24 GB.
``LazyYoutuVL`` holds the config, a parameter-free skeleton of :class:`YoutuVL` (parameters on
``meta``, RoPE buffers real) and a :class:`~ncnnport.lazy_weights.WeightSource`; ``part(path)``
returns a copy of one submodule with only its own tensors read (a local checkpoint through
``safe_open``, or the seeded ``real`` preset generated per tensor). The export wrappers ask for
parts only, so export holds one layer at a time.

The whole model (e2e parity, the torch bench, the run verb) is built on demand by ``full()`` or
by any attribute this object does not have (``vl.llm``, ``vl.embed(...)``), so code written
against :class:`YoutuVL` keeps working.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ncnnport.lazy_weights import (Init, LazyModel, SafetensorsSource, SeededSource, WeightSource, empty_module,
                                   materialize, parameter_shapes)
from ncnnport.models.youtu_vl.checkpoint import IGNORED_KEYS, TIED_KEY, CheckpointError
from ncnnport.models.youtu_vl.config import YoutuVLConfig
from ncnnport.models.youtu_vl.model import YoutuVL

EMBED_KEY = "model.embed_tokens.weight"
# Seeded real preset (measured on the real dims, LAYERS=4, one 448x448 fixture): Linear weights
# N(0, 1/fan_in) keep every residual stream at rms 0.5-3 through the vision tower and the LLM;
# embedding rows N(0, 0.5) give last-position logits with a std of ~20, so greedy steps have
# clear top-2 margins instead of near-ties.
REAL_SEED = 0
REAL_LINEAR_GAIN = 1.0
REAL_EMBED_STD = 0.5
REAL_NORM_STD = 0.1


def seeded_init_rule(skeleton: nn.Module) -> Callable[[str, tuple[int, ...]], Init]:
    """mean/std per tensor, classified by the owning module's type."""
    from ncnnport.lazy_weights import parameter_owners

    owners = parameter_owners(skeleton)

    def rule(name: str, shape: tuple[int, ...]) -> Init:
        mod = owners[name]
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(mod, nn.Embedding):
            return Init(0.0, REAL_EMBED_STD)
        if isinstance(mod, (nn.Linear, nn.Conv2d)):
            fan_in = 1
            for d in mod.weight.shape[1:]:
                fan_in *= int(d)
            std = REAL_LINEAR_GAIN / float(fan_in) ** 0.5
            return Init(0.0, std if leaf == "weight" else std / 4)
        # LayerNorm / RMSNorm: weight 1 +- 10 %, bias small
        return Init(1.0, REAL_NORM_STD) if leaf == "weight" else Init(0.0, 0.02)
    return rule


class LazyYoutuVL(LazyModel):
    error_type = CheckpointError
    model_name = "the youtu-vl config"
    OWN = ("cfg", "source", "skeleton")

    def __init__(self, cfg: YoutuVLConfig, source: WeightSource, *, strict_folder: Path | None = None) -> None:
        self.cfg = cfg
        self._strict_folder = strict_folder
        super().__init__(empty_module(lambda: YoutuVL(cfg)), source)

    def head_rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows of the (tied) lm_head weight, read without the rest of the table."""
        if self._full is not None:
            return self._full.head_rows(start, stop)
        return self.source.get_rows(TIED_KEY, start, stop)

    def _build_full(self) -> YoutuVL:
        if self._strict_folder is not None:
            from ncnnport.models.youtu_vl.checkpoint import load_checkpoint
            return load_checkpoint(self._strict_folder)[0]
        vl = materialize(self.skeleton, self.source, "")
        vl.tie_weights()
        vl.eval()
        vl.llm.eval()
        return vl


def _aliases(cfg: YoutuVLConfig) -> dict[str, str]:
    return {TIED_KEY: EMBED_KEY} if cfg.text.tie_word_embeddings else {}


def seeded(cfg: YoutuVLConfig, seed: int = REAL_SEED) -> LazyYoutuVL:
    """``cfg`` with seeded per-tensor weights (the ``real`` preset's recipe at any dims)."""
    skeleton = empty_module(lambda: YoutuVL(cfg))
    aliases = _aliases(cfg)
    source = SeededSource(parameter_shapes(skeleton), seeded_init_rule(skeleton), seed=seed, aliases=aliases)
    return LazyYoutuVL(cfg, source)


def from_folder(folder: Path, cfg: YoutuVLConfig, *, truncated: bool) -> LazyYoutuVL:
    """A local checkpoint folder read per module. Untruncated, unexpected tensors are errors and
    the whole model comes from the strict loader; truncated to K layers, the later layers'
    tensors are expected and never read."""
    source = SafetensorsSource(folder, aliases=_aliases(cfg))
    if not truncated:
        expected = set(parameter_shapes(empty_module(lambda: YoutuVL(cfg))))
        unexpected = sorted(set(source.names()) - expected - set(IGNORED_KEYS))
        if unexpected:
            raise CheckpointError(f"checkpoint {folder} does not match the youtu-vl config: "
                                  f"{len(unexpected)} unexpected keys {unexpected[:8]}")
    return LazyYoutuVL(cfg, source, strict_folder=None if truncated else Path(folder))
