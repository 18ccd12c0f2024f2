"""The whole Youtu-VL reference: vision tower + merger + the transformers Youtu LLM.

Why a container with ``model``/``lm_head`` at the top level: the official checkpoint names the
LLM weights ``model.*`` (no ``language_model.`` prefix), so the container registers the LLM's
children directly and keeps the ``YoutuForCausalLM`` object, which owns them, unregistered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ncnnport.models.youtu_vl.config import EOS_ID, YoutuVLConfig, check_positions
from ncnnport.models.youtu_vl.processor import ProcessedImage
from ncnnport.models.youtu_vl.prompt import fuse
from ncnnport.models.youtu_vl.vision import PatchMerger, Siglip2


class YoutuVL(nn.Module):
    def __init__(self, cfg: YoutuVLConfig) -> None:
        super().__init__()
        from transformers import YoutuForCausalLM

        cfg.validate()
        self.cfg = cfg
        self.siglip2 = Siglip2(cfg.vision)
        self.merger = PatchMerger(cfg.vision)
        llm = YoutuForCausalLM(cfg.text.to_hf())
        object.__setattr__(self, "llm", llm)  # owner of model/lm_head, not a registered child
        self.model = llm.model
        self.lm_head = llm.lm_head
        self.tie_weights()
        self.eval()
        llm.eval()

    def part(self, path: str) -> nn.Module:
        """Submodule ``path`` (the same interface as ``LazyYoutuVL.part``, which reads it lazily):
        export wrappers ask for parts only, so they never need the whole model."""
        return self.get_submodule(path)

    def head_rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of the lm_head weight (``LazyYoutuVL`` reads only those rows)."""
        return self.lm_head.weight[start:stop].detach()

    def tie_weights(self) -> None:
        if self.cfg.text.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    # --- reference stages ----------------------------------------------------------------
    @torch.inference_mode()
    def vision_features(self, image: ProcessedImage) -> np.ndarray:
        """``[N, vision_hidden]`` post-LN tower output in merge-block-major order."""
        pv = torch.from_numpy(image.pixel_values)
        return self.siglip2.vision_model(pv, image.grid_hw).numpy()

    @torch.inference_mode()
    def merge(self, features: np.ndarray) -> np.ndarray:
        return self.merger(torch.from_numpy(features)).numpy()

    @torch.inference_mode()
    def embed(self, ids: np.ndarray) -> np.ndarray:
        return self.model.embed_tokens(torch.from_numpy(np.asarray(ids, dtype=np.int64))).numpy()


@dataclass
class ReferenceRun:
    """Intermediate tensors and greedy tokens of one reference generation."""

    vision: np.ndarray | None
    merged: np.ndarray | None
    first_logits: np.ndarray
    tokens: list[int] = field(default_factory=list)
    step_logits: list[np.ndarray] = field(default_factory=list)


@torch.inference_mode()
def reference_generate(vl: YoutuVL, ids: np.ndarray, image: ProcessedImage | None,
                       max_new_tokens: int, *, stop_at_eos: bool = True) -> ReferenceRun:
    """Greedy generation with the transformers LLM and its own KV cache (eager attention, fp32)."""
    from transformers import DynamicCache

    check_positions(int(ids.size), max_new_tokens, vl.cfg)
    vision = merged = None
    if image is not None:
        vision = vl.vision_features(image)
        merged = vl.merge(vision)
    embeds = fuse(vl.embed(ids), ids, merged)
    cache = DynamicCache(config=vl.llm.config)
    out = vl.llm(inputs_embeds=torch.from_numpy(embeds)[None], cache=cache, use_cache=True,
                 logits_to_keep=1)
    logits = out.logits[0, -1].float().numpy().copy()
    run = ReferenceRun(vision, merged, logits)
    for _ in range(max_new_tokens):
        token = int(np.argmax(logits))
        run.tokens.append(token)
        run.step_logits.append(logits)
        if stop_at_eos and token == EOS_ID:
            break
        out = vl.llm(input_ids=torch.tensor([[token]]), cache=out.cache, use_cache=True)
        logits = out.logits[0, -1].float().numpy().copy()
    return run
