"""Build the SeedVR2 reference (DiT + VAE + text embedding) from a preset or a checkpoint folder.

Checkpoint folder layout (safetensors only; user files are never unpickled):
  config.json          {"format": "ncnnport-seedvr2", "config": SeedVR2Config.to_json()}
  dit*.safetensors     NaDiT state dict, official key names (shards merged)
  vae*.safetensors     VAE state dict, official key names (``encoder.*``, ``decoder.*``)
  text.safetensors     optional: ``positive`` prompt embedding (L, txt_in_dim)
Loads are strict: a missing or unexpected key (e.g. absent ``attn.rope.rope.freqs``) raises.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ncnnport.models.seedvr2.config import PRESETS, SeedVR2Config
from ncnnport.models.seedvr2.dit import NaDiT
from ncnnport.models.seedvr2.folder import FORMAT, matches, read_config
from ncnnport.models.seedvr2.vae import VideoAutoencoderKL

@dataclass
class SeedVR2:
    """A fully built model (tiny presets, or any model already in memory).

    ``view`` mirrors :meth:`.lazy.LazySeedVR2.view` so the export specs serve both: here every
    weight is already present, so a view is simply the submodule (no copy, nothing read)."""

    config: SeedVR2Config
    dit: NaDiT
    vae: VideoAutoencoderKL
    text: torch.Tensor  # positive prompt embedding (L, txt_in_dim)

    def view(self, root: str, parts: Sequence[str]) -> nn.Module:
        top, _, rest = root.partition(".")
        mod = getattr(self, top)
        return mod.get_submodule(rest) if rest else mod

    def part(self, root: str) -> nn.Module:
        """Submodule ``root`` with all its weights."""
        return self.view(root, [])

    def view_names(self, root: str, parts: Sequence[str]) -> list[str]:
        return [f"{root}.{n}" for n, _ in self.view(root, parts).named_parameters() if matches(n, parts)]

    def view_bytes(self, root: str, parts: Sequence[str]) -> int:
        return sum(4 * p.numel() for n, p in self.view(root, parts).named_parameters() if matches(n, parts))


def _seeded_init(module: nn.Module, gen: torch.Generator) -> None:
    """Deterministic non-degenerate weights for tiny presets.

    Linear/conv weights ~ N(0, 1/fan_in); biases and norm offsets small; adaptive-modulation
    B-terms as the official init (shift/gate ~ randn/sqrt(D), scale ~ 1 + randn/sqrt(D)) so
    gates are non-zero and every block and both emb slots influence the output.
    """
    with torch.no_grad():
        for name, p in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.ndim >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
            elif leaf.endswith("_scale"):
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) / math.sqrt(p.numel()))
            elif leaf.endswith(("_shift", "_gate")):
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.numel()))
            elif leaf == "weight":  # norm weights
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:                   # biases
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))


def build(config: SeedVR2Config, seed: int = 0) -> SeedVR2:
    """Seeded random-weight model (tiny presets; the real preset would need ~14 GB)."""
    gen = torch.Generator().manual_seed(seed)
    dit, vae = NaDiT(config.dit), VideoAutoencoderKL(config.vae)
    _seeded_init(dit, gen)
    _seeded_init(vae, gen)
    with torch.no_grad():
        # keep decoded pixels mostly inside [-1, 1] so the uint8 comparison is not saturated
        vae.decoder.conv_out.weight.mul_(0.3)
    text = torch.randn(config.text_len, config.dit.txt_in_dim, generator=gen)
    return SeedVR2(config, dit.eval(), vae.eval(), text)


def from_preset(name: str, seed: int = 0) -> SeedVR2:
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    if name == "real":
        raise ValueError("the real preset is 3.4B parameters: load it from a checkpoint folder")
    return build(PRESETS[name], seed)


def truncate(model: SeedVR2, layers: int | None) -> SeedVR2:
    """The first ``layers`` DiT blocks of a built model (see ``config.LAYER_STACKS``): the
    K-block NaDiT takes its tensors by name from the whole one (block K-1's video-only ada/MLP
    are the whole block's ``vid`` tensors), so every kept value equals the untruncated preset."""
    from ncnnport.models.kit import truncate as cut
    from ncnnport.models.seedvr2.config import LAYER_STACKS

    if layers is None:
        return model
    config = cut(model.config, LAYER_STACKS, layers, "the seedvr2 model")
    with torch.device("meta"):
        dit = NaDiT(config.dit)
    full = model.dit.state_dict()
    dit.load_state_dict({k: full[k] for k in dit.state_dict()}, strict=True, assign=True)
    return SeedVR2(config, dit.eval(), model.vae, model.text)


def save(model: SeedVR2, folder: Path) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"format": FORMAT, "config": model.config.to_json()},
                                                   indent=2))
    save_file({k: v.contiguous() for k, v in model.dit.state_dict().items()}, str(folder / "dit.safetensors"))
    save_file({k: v.contiguous() for k, v in model.vae.state_dict().items()}, str(folder / "vae.safetensors"))
    save_file({"positive": model.text.contiguous()}, str(folder / "text.safetensors"))


def _read_shards(folder: Path, prefix: str) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob(f"{prefix}*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no {prefix}*.safetensors")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        part = load_file(str(f))
        dup = set(part) & set(state)
        if dup:
            raise ValueError(f"{f}: keys also in another shard: {sorted(dup)[:5]}")
        state.update(part)
    return state


def _load_strict(module: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    own = module.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise KeyError(f"{what}: missing {missing[:8]} ({len(missing)}), unexpected {unexpected[:8]} "
                       f"({len(unexpected)})")
    for k, v in own.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise ValueError(f"{what}: {k} has shape {tuple(state[k].shape)}, model expects {tuple(v.shape)}")
    module.load_state_dict({k: v.float() for k, v in state.items()}, strict=True, assign=True)


def load(folder: Path) -> SeedVR2:
    """Strict load of a checkpoint folder. Modules are created on the meta device and the
    tensors assigned, so a real 3B checkpoint is never allocated twice."""
    folder = Path(folder)
    config = read_config(folder)
    with torch.device("meta"):
        dit, vae = NaDiT(config.dit), VideoAutoencoderKL(config.vae)
    _load_strict(dit, _read_shards(folder, "dit"), f"{folder} DiT")
    _load_strict(vae, _read_shards(folder, "vae"), f"{folder} VAE")
    text_file = folder / "text.safetensors"
    if text_file.is_file():
        text = load_file(str(text_file))["positive"].float()
    else:
        raise FileNotFoundError(f"{folder}: text.safetensors (positive prompt embedding) is missing")
    if text.ndim != 2 or text.shape[1] != config.dit.txt_in_dim:
        raise ValueError(f"{text_file}: positive embedding {tuple(text.shape)}, needs (L, {config.dit.txt_in_dim})")
    return SeedVR2(config, dit.eval(), vae.eval(), text)
