"""Seeded presets materialised as checkpoint folders.

Why a folder: the runtime loads the tiny preset through the same strict loader and tokenizer
path as a real checkpoint, so the preset exercises the real code path. Weights are
re-initialised with a larger std than HF's 0.02: at std 0.02 a tiny model emits one token over
and over, which hides cache and position bugs and gives no logit margins worth the name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ncnnport.paths import preset_cache_root
from torch import nn

from ncnnport.models.youtu_vl.config import YoutuVLConfig, preset_config
from ncnnport.models.youtu_vl.model import YoutuVL
from ncnnport.models.youtu_vl.tokenizer import CORPUS

INIT_VERSION = 1  # bump when the init recipe changes: cached folders are keyed by it
WEIGHT_STD = {"tiny": 0.12, "mid": 0.06}  # mid: fan-in ~30x larger; 0.06 still gives varied tokens
EMBED_STD = 0.5


def default_cache_root() -> Path:
    return preset_cache_root() / "youtu_vl"


@torch.no_grad()
def reinit(vl: YoutuVL, seed: int, std: float = WEIGHT_STD["tiny"]) -> None:
    """Deterministic weights: Linear N(0, std), biases N(0, 0.05), norms 1 + N(0, 0.1), embed N(0, 0.5)."""
    g = torch.Generator().manual_seed(seed)
    for name, module in vl.named_modules():
        if isinstance(module, nn.Linear):
            if module is vl.lm_head and vl.cfg.text.tie_word_embeddings:
                continue
            module.weight.copy_(torch.randn(module.weight.shape, generator=g) * std)
            if module.bias is not None:
                module.bias.copy_(torch.randn(module.bias.shape, generator=g) * 0.05)
        elif isinstance(module, nn.Embedding):
            module.weight.copy_(torch.randn(module.weight.shape, generator=g) * EMBED_STD)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or type(module).__name__.endswith("RMSNorm"):
            module.weight.copy_(1.0 + torch.randn(module.weight.shape, generator=g) * 0.1)
            if getattr(module, "bias", None) is not None:
                module.bias.copy_(torch.randn(module.bias.shape, generator=g) * 0.05)
    vl.tie_weights()


def build_preset_model(cfg: YoutuVLConfig, seed: int, std: float = WEIGHT_STD["tiny"]) -> YoutuVL:
    torch.manual_seed(seed)
    vl = YoutuVL(cfg)
    reinit(vl, seed, std)
    return vl


def preset_key(name: str, seed: int) -> str:
    cfg = preset_config(name)
    blob = json.dumps({"cfg": cfg.to_json(), "seed": seed, "init": INIT_VERSION, "std": WEIGHT_STD.get(name),
                       "corpus": hashlib.sha256(CORPUS.read_bytes()).hexdigest()}, sort_keys=True)
    return f"{name}-s{seed}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def write_preset(name: str, folder: Path, seed: int = 0) -> Path:
    """Write the preset's checkpoint folder (config, safetensors, tokenizer) to ``folder``."""
    from ncnnport.models.youtu_vl.checkpoint import save_checkpoint
    from ncnnport.models.youtu_vl.tokenizer import build_tiny_tokenizer

    if name == "real":  # weights are generated per tensor on demand (lazy.seeded), never stored
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(preset_config(name).to_json(), indent=2) + "\n")
        build_tiny_tokenizer(folder)
        return folder
    vl = build_preset_model(preset_config(name), seed, WEIGHT_STD[name])
    save_checkpoint(vl, folder)
    build_tiny_tokenizer(folder)
    return folder


def materialise_preset(name: str, seed: int = 0, root: Path | None = None) -> Path:
    """Checkpoint folder of a seeded preset, written once (atomically) and reused. The ``real``
    preset's folder holds config.json and the stand-in tokenizer only (no weights)."""
    root = Path(root) if root else default_cache_root()
    final = root / preset_key(name, seed)
    if (final / "config.json").is_file() and (final / "tokenizer.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}."))
    try:
        write_preset(name, tmp, seed)
        try:
            os.replace(tmp, final)
        except OSError:  # another process won the race: use its folder
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
