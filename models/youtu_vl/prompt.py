"""Chat prompt and token fusion (spec sections 3 and 7).

Why here and not in a Jinja template: the official chat_template.json was not available, so the
exact text (no newline after ``<|vision_end|>``) is written once, as plain Python, and both the
reference and the ncnn pipeline tokenize through it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ncnnport.models.youtu_vl.config import IMAGE_PAD_ID

BOT, EOT = "<|begin_of_text|>", "<|end_of_text|>"
VSTART, VEND, IMAGE_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"


def chat_text(prompt: str, num_image_tokens: int | None, system: str) -> str:
    """The full prompt string; ``num_image_tokens=None`` gives the text-only form."""
    vision = "" if num_image_tokens is None else VSTART + IMAGE_PAD * num_image_tokens + VEND
    return (f"{BOT}system\n{system}{EOT}\n"
            f"{BOT}user\n{vision}{prompt}{EOT}\n"
            f"{BOT}assistant\n")


def encode_prompt(tokenizer: Any, prompt: str, num_image_tokens: int | None, system: str) -> np.ndarray:
    """int64 ids of the chat prompt; checks the image-pad count the fusion relies on."""
    text = chat_text(prompt, num_image_tokens, system)
    encoded = tokenizer.encode(text, add_special_tokens=False)
    ids = np.asarray(getattr(encoded, "ids", encoded), dtype=np.int64)
    pads = int((ids == IMAGE_PAD_ID).sum())
    want = num_image_tokens or 0
    if pads != want:
        raise ValueError(f"prompt has {pads} <|image_pad|> tokens, expected {want}")
    return ids


def fuse(text_embeds: np.ndarray, ids: np.ndarray, visual: np.ndarray | None) -> np.ndarray:
    """Replace, in order, the rows at IMAGE_PAD positions by the merged visual tokens.

    ``text_embeds [L, D]``, ``ids [L]``, ``visual [T, D]`` -> ``[L, D]`` (a copy). Equivalent to the
    official ``masked_scatter``; a count mismatch is an error rather than a silent partial fill.
    """
    out = np.array(text_embeds, dtype=np.float32, copy=True)
    where = np.flatnonzero(np.asarray(ids) == IMAGE_PAD_ID)
    n_vis = 0 if visual is None else visual.shape[0]
    if where.size != n_vis:
        raise ValueError(f"{where.size} <|image_pad|> positions but {n_vis} visual tokens")
    if n_vis:
        out[where] = visual
    return out
