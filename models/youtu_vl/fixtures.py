"""Synthesised e2e fixtures: images whose grids cover every window-layout case (spec section 5).

Why synthesised: no test images can be downloaded, and what matters for parity is the grid
shape (one window, two windows with a 6-token strip, six windows, an extreme strip, a single
merge block), not the picture. Images are gradients plus seeded noise so patches differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image


def synthetic_image(height: int, width: int, seed: int = 0) -> Image.Image:
    """Deterministic RGB image: row/column gradients plus seeded noise."""
    rng = np.random.default_rng(seed)
    y = np.broadcast_to(np.linspace(0, 255, height)[:, None], (height, width))
    x = np.broadcast_to(np.linspace(0, 255, width)[None, :], (height, width))
    base = np.stack([y, x, (x + y) / 2], axis=-1)
    noise = rng.normal(0, 25, (height, width, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


@dataclass(frozen=True)
class Fixture:
    name: str
    size_hw: tuple[int, int] | None  # None: text-only
    prompt: str
    why: str

    def image(self, seed: int = 0) -> Image.Image | None:
        return None if self.size_hw is None else synthetic_image(*self.size_hw, seed=seed)


FIXTURES: tuple[Fixture, ...] = (
    Fixture("one_window", (200, 230), "Describe this image.", "14x16 patch grid: a single window"),
    Fixture("grid_12x18", (180, 270), "What is in the picture?",
            "12x18 patch grid: 2 windows (48 + 6 merged tokens), permutation is not an involution"),
    Fixture("six_windows", (520, 300), "Count the objects.", "34x20 patch grid: 3x2 windows"),
    Fixture("strip_32x2048", (32, 2048), "Read the text in the image.",
            "2x128 patch grid: extreme aspect ratio, 8 windows of 1x8 merged tokens"),
    Fixture("tiny_5x7", (5, 7), "What is this?", "5x7 px upscaled to one 2x2 merge block"),
    Fixture("text_only", None, "Tell me a short story about a red house.", "no image"),
)
