"""SeedVR2 built one graph's weights at a time from a lazy weight source.

Why: the real model is 3.64e9 parameters (14.6 GB fp32) while one exported graph needs at most
one DiT block half (~0.5 GB). A :class:`LazySeedVR2` holds the config, parameter-free skeletons
of the DiT and the VAE (parameters on ``meta``, buffers such as the RoPE ``freqs`` real) and a
:class:`~ncnnport.lazy_weights.WeightSource` whose tensor names are the checkpoint's with a
``dit.`` / ``vae.`` / ``text.`` prefix. :meth:`LazySeedVR2.view` returns a copy of one skeleton
subtree in which ONLY the listed parameters are read from the source; everything else stays on
``meta``. The whole reference (``.dit``, ``.vae``: e2e parity, the torch bench, the run verb's
torch side) is materialised only when asked for.

Sources: seeded per-tensor weights (:func:`seeded`, the ``real`` preset) or a local checkpoint
folder in this project's layout (:class:`FolderSource`, read per tensor with ``safe_open``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from ncnnport.lazy_weights import (InitRule, SafetensorsSource, SeededSource, WeightSource, WeightSourceError, empty_module,
                                   parameter_shapes)
from ncnnport.models.seedvr2.config import SeedVR2Config
from ncnnport.models.seedvr2.dit import NaDiT
from ncnnport.models.seedvr2.mmrope import rope_freqs
from ncnnport.models.seedvr2.folder import matches
from ncnnport.models.seedvr2.vae import VideoAutoencoderKL

ROOTS = ("dit", "vae")
TEXT = "text.positive"


class LazySeedVR2:
    """Config + meta skeletons + a weight source; the SeedVR2 model one view at a time."""

    def __init__(self, config: SeedVR2Config, source: WeightSource, *, truncated: bool = False,
                 stores_buffers: bool = False) -> None:
        self.config = config
        self.source = source
        self.skeletons: dict[str, nn.Module] = {
            "dit": empty_module(lambda: NaDiT(config.dit)).eval(),
            "vae": empty_module(lambda: VideoAutoencoderKL(config.vae)).eval(),
        }
        self._full: dict[str, nn.Module] = {}
        self._text: torch.Tensor | None = None
        self._check_names(truncated, stores_buffers)

    # --- checks --------------------------------------------------------------------------------
    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the model reads: skeleton parameters and the prompt embedding."""
        out: dict[str, tuple[int, ...]] = {}
        for root, skel in self.skeletons.items():
            out.update(parameter_shapes(skel, root))
        out[TEXT] = (self.config.text_len, self.config.dit.txt_in_dim)
        return out

    def _check_names(self, truncated: bool, stores_buffers: bool) -> None:
        """Missing or mis-shaped tensors are errors naming them (never a random fill); an
        untruncated checkpoint may hold nothing else but the RoPE ``freqs`` buffers."""
        names = set(self.source.names())
        want = self.expected_shapes()
        buffers = {f"dit.{k}" for k, _ in self.skeletons["dit"].named_buffers()}
        # a seeded source has no buffers (constructors compute them); a checkpoint must hold
        # the kept blocks' RoPE freqs, as a strict load of the official one does
        required = set(want) | (buffers if stores_buffers else set())
        missing = sorted(n for n in required if n not in names and n != TEXT)
        bad = [f"{n}: source {self.source.shape(n)} vs model {s}" for n, s in want.items()
               if n in names and n != TEXT and tuple(self.source.shape(n)) != tuple(s)]
        text_bad = TEXT in names and (len(self.source.shape(TEXT)) != 2
                                      or self.source.shape(TEXT)[1] != self.config.dit.txt_in_dim)
        problems = []
        if missing:
            problems.append(f"missing {len(missing)} tensor(s): {missing[:8]}")
        if bad:
            problems.append(f"shape mismatch: {'; '.join(bad[:8])}")
        if TEXT not in names:
            problems.append(f"no {TEXT} (positive prompt embedding)")
        elif text_bad:
            problems.append(f"{TEXT} is {self.source.shape(TEXT)}, needs (L, {self.config.dit.txt_in_dim})")
        if not truncated:
            unexpected = sorted(names - set(want) - buffers)
            if unexpected:
                problems.append(f"unexpected {len(unexpected)} tensor(s): {unexpected[:8]}")
        if problems:
            raise WeightSourceError(f"{self.source.describe()} does not match SeedVR2 "
                                    f"(DiT {self.config.dit.num_layers} blocks): " + " | ".join(problems))
        self._check_rope(names & buffers)

    def _check_rope(self, stored: set[str]) -> None:
        """Host RoPE tables are computed from the config: a checkpoint's ``freqs`` buffers must
        hold exactly those frequencies."""
        d = self.config.dit
        want = rope_freqs(d.rope_axis_dim, d.rope_theta)
        for name in sorted(stored):
            got = self.source.get(name)
            if got.shape != want.shape or not torch.allclose(got, want, rtol=0, atol=1e-7):
                raise ValueError(f"{name[len('dit.'):]} differ from 1/theta^(2i/d): the host RoPE "
                                 "tables are computed from the config")

    # --- one view at a time --------------------------------------------------------------------
    def view(self, root: str, parts: Sequence[str]) -> nn.Module:
        """A copy of skeleton subtree ``root`` (``"dit"``, ``"vae"``, ``"dit.blocks.3"``) whose
        parameters named by ``parts`` (relative names or prefixes) are read from the source;
        every other parameter stays on ``meta``, so only these tensors are read or allocated."""
        mod = copy.deepcopy(self._skeleton(root))
        used = set()
        for sub_name, m in mod.named_modules():
            for pname, param in list(m._parameters.items()):
                rel = f"{sub_name}.{pname}" if sub_name else pname
                if param is None or not matches(rel, parts):
                    continue
                used.update(p for p in parts if rel == p or rel.startswith(p + "."))
                value = self.source.get(f"{root}.{rel}", tuple(param.shape))
                m._parameters[pname] = nn.Parameter(value, requires_grad=False)
        unused = sorted(set(parts) - used)
        if unused:
            raise KeyError(f"{root}: no parameters under {unused}")
        return mod.eval()

    def part(self, root: str) -> nn.Module:
        """A copy of skeleton subtree ``root`` with ALL its parameters read from the source."""
        return self.view(root, [n for n, _ in self._skeleton(root).named_parameters()])

    def _skeleton(self, root: str) -> nn.Module:
        top, _, rest = root.partition(".")
        skel = self.skeletons[top]
        return skel.get_submodule(rest) if rest else skel

    def view_names(self, root: str, parts: Sequence[str]) -> list[str]:
        """Full source names :meth:`view` reads for ``(root, parts)`` (nothing is read)."""
        return [f"{root}.{n}" for n, _ in self._skeleton(root).named_parameters() if matches(n, parts)]

    def view_bytes(self, root: str, parts: Sequence[str]) -> int:
        """float32 bytes of a view's weights (from shapes; nothing is read)."""
        return sum(4 * int(torch.Size(self.source.shape(n)).numel()) for n in self.view_names(root, parts))

    # --- the whole model, on demand ------------------------------------------------------------
    def _whole(self, root: str) -> nn.Module:
        if root not in self._full:
            self._full[root] = self.part(root)
        return self._full[root]

    @property
    def dit(self) -> NaDiT:
        return self._whole("dit")  # type: ignore[return-value]

    @property
    def vae(self) -> VideoAutoencoderKL:
        return self._whole("vae")  # type: ignore[return-value]

    @property
    def text(self) -> torch.Tensor:
        if self._text is None:
            self._text = self.source.get(TEXT)
        return self._text

    def materialized(self) -> list[str]:
        """Which whole sub-models are held (tests check that export never asked for one)."""
        return sorted(self._full)


def seeded(config: SeedVR2Config, seed: int, rule: InitRule | None = None) -> LazySeedVR2:
    """``config`` with seeded per-tensor weights (:mod:`.seeded`'s rule). Each tensor is a
    function of (seed, full-model name, shape) only, so a K-block model (``--layers K``) holds
    exactly the whole model's values for every tensor it has."""
    from ncnnport.models.seedvr2.seeded import init_rule

    shapes: dict[str, tuple[int, ...]] = {}
    shapes.update(parameter_shapes(empty_module(lambda: NaDiT(config.dit)), "dit"))
    shapes.update(parameter_shapes(empty_module(lambda: VideoAutoencoderKL(config.vae)), "vae"))
    shapes[TEXT] = (config.text_len, config.dit.txt_in_dim)
    return LazySeedVR2(config, SeededSource(shapes, rule or init_rule, seed=seed), truncated=True)


class FolderSource(SafetensorsSource):
    """A checkpoint folder of this project's layout (``model.py``): ``dit*.safetensors``,
    ``vae*.safetensors``, ``text.safetensors``; names get a ``dit.`` / ``vae.`` / ``text.``
    prefix. Tensors are read one by one with ``safe_open`` (nothing stays mapped between reads);
    pickles are never opened."""

    PREFIXES = {"dit": "dit*.safetensors", "vae": "vae*.safetensors", "text": "text.safetensors"}

    def __init__(self, folder: Path) -> None:
        WeightSource.__init__(self)  # the layout differs from SafetensorsSource's: no shared scan
        from safetensors import safe_open

        self.folder = Path(folder)
        self.files: dict[str, Path] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        for prefix, pattern in self.PREFIXES.items():
            shards = sorted(self.folder.glob(pattern))
            if not shards and prefix != "text":
                raise FileNotFoundError(f"{self.folder}: no {pattern}")
            for shard in shards:
                with safe_open(str(shard), framework="pt") as f:
                    for k in f.keys():
                        name = f"{prefix}.{k}"
                        if name in self.files:
                            raise ValueError(f"{shard}: {k} is also in {self.files[name].name}")
                        self.files[name] = shard
                        self._shapes[name] = tuple(f.get_slice(k).get_shape())

    def _key(self, name: str) -> str:
        return name.split(".", 1)[1]  # "dit.blocks.0..." is "blocks.0..." in dit*.safetensors


def from_folder(folder: Path, config: SeedVR2Config, truncated: bool) -> LazySeedVR2:
    """A checkpoint folder read per view. Untruncated, unexpected tensors are errors (a strict
    load); truncated to K blocks, the other blocks' tensors are expected and never read."""
    return LazySeedVR2(config, FolderSource(Path(folder)), truncated=truncated, stores_buffers=True)
