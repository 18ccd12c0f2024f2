"""Write and strictly load a local HF-format checkpoint folder (safetensors only).

Why strict: a missing or misnamed tensor silently keeps its random init and every parity number
downstream would still look plausible. Every key of the folder must map to a parameter and every
parameter must be present; the only tolerated extras are listed in ``IGNORED_KEYS`` with why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ncnnport.fsutil import read_json_object
from ncnnport.lazy_weights import checkpoint_shards

from ncnnport.models.youtu_vl.config import YoutuVLConfig
from ncnnport.models.youtu_vl.model import YoutuVL
from ncnnport.models.youtu_vl.tokenizer import load_tokenizer

# key -> reason it may be present in a checkpoint without a parameter behind it
IGNORED_KEYS = {
    "siglip2.vision_model.embeddings.position_embedding.weight":
        "the official tower adds no position embedding (spec section 4); the table may be shipped unused",
}
TIED_KEY = "lm_head.weight"


class CheckpointError(ValueError):
    """The folder does not hold exactly the tensors of the configured model."""


def save_checkpoint(vl: YoutuVL, folder: Path) -> None:
    """config.json + model.safetensors (tied lm_head stored once, as ``model.embed_tokens.weight``)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in vl.state_dict().items()}
    if vl.cfg.text.tie_word_embeddings:
        state.pop(TIED_KEY, None)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(vl.cfg.to_json(), indent=2) + "\n")


def _weight_files(folder: Path) -> list[Path]:
    return checkpoint_shards(folder)


def read_config(folder: Path) -> YoutuVLConfig:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {folder}: no config.json")
    return YoutuVLConfig.from_json(read_json_object(path), source=str(path))


def load_checkpoint(folder: Path) -> tuple[YoutuVL, Any]:
    """(model in eval mode, tokenizer) from ``folder``; raises :class:`CheckpointError` on any key mismatch."""
    from safetensors import safe_open
    from transformers.models.youtu.modeling_youtu import YoutuRotaryEmbedding

    folder = Path(folder)
    cfg = read_config(folder)
    tokenizer = load_tokenizer(folder)
    with torch.device("meta"):
        vl = YoutuVL(cfg)
    expected = dict(vl.state_dict())
    tied = cfg.text.tie_word_embeddings
    loaded: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for path in _weight_files(folder):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                if key in IGNORED_KEYS or (tied and key == TIED_KEY):
                    continue
                if key not in expected:
                    unexpected.append(key)
                    continue
                loaded[key] = f.get_tensor(key)
    need = set(expected) - ({TIED_KEY} if tied else set())
    missing = sorted(need - set(loaded))
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {folder} does not match the youtu-vl config: "
            f"{len(missing)} missing keys {missing[:8]}{' ...' if len(missing) > 8 else ''}; "
            f"{len(unexpected)} unexpected keys {sorted(unexpected)[:8]}"
            f"{' ...' if len(unexpected) > 8 else ''}")
    for key, tensor in loaded.items():
        want = tuple(expected[key].shape)
        if tuple(tensor.shape) != want:
            raise CheckpointError(f"checkpoint {folder}: {key} has shape {tuple(tensor.shape)}, "
                                  f"config implies {want}")
        loaded[key] = tensor.to(torch.float32)
    vl.load_state_dict(loaded, strict=False, assign=True)
    vl.tie_weights()
    # Non-persistent buffers (RoPE inv_freq) were created on meta; rebuild them on the CPU.
    vl.model.rotary_emb = YoutuRotaryEmbedding(vl.llm.config)
    on_meta = [n for n, t in list(vl.named_parameters()) + list(vl.named_buffers()) if t.is_meta]
    if on_meta:
        raise CheckpointError(f"checkpoint {folder}: tensors left uninitialised: {on_meta[:8]}")
    vl.eval()
    vl.llm.eval()
    return vl, tokenizer
