"""Write and strictly load Qwen3-ASR checkpoint folders (HF layout, safetensors only).

Why: parity numbers are only meaningful if the torch reference holds exactly the weights of the
folder; HF's ``from_pretrained`` warns and random-initialises on missing keys. Here a missing or
unexpected tensor is an error that names the keys. Weights are read with ``safetensors`` only:
no ``torch.load`` (pickle) of user files, ever.

Folder layout (same as a real checkpoint): ``config.json``, ``model.safetensors`` (or
``model.safetensors.index.json`` + shards), tokenizer files, ``processor_config.json`` /
``preprocessor_config.json`` and ``chat_template.jinja``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (
    AutoProcessor,
    Qwen3ASRConfig,
    Qwen3ASRForConditionalGeneration,
    Qwen3ASRProcessor,
)

from ncnnport.lazy_weights import WEIGHTS_NAME, checkpoint_shards

# Tied to the embedding when config.tie_word_embeddings: may be absent (or present) in a file.
TIED_KEYS = ("lm_head.weight",)


class CheckpointError(ValueError):
    """A checkpoint folder is incomplete or does not match the architecture."""


def _fmt_keys(keys: Iterable[str], limit: int = 12) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:limit])
    return shown + (f", ... (+{len(keys) - limit} more)" if len(keys) > limit else "")


def save_checkpoint(
    model: Qwen3ASRForConditionalGeneration, processor: Qwen3ASRProcessor, folder: str | Path
) -> Path:
    """Write config.json + model.safetensors (fp32, tied lm_head omitted) + processor files."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(folder))
    state = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        for key in TIED_KEYS:
            state.pop(key, None)
    save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    processor.save_pretrained(str(folder))
    return folder


def _weight_files(folder: Path) -> list[Path]:
    try:
        return checkpoint_shards(folder)
    except FileNotFoundError as exc:
        raise CheckpointError(str(exc)) from exc


def read_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of the folder's safetensors file(s), as stored (dtype unchanged)."""
    state: dict[str, torch.Tensor] = {}
    for path in _weight_files(Path(folder)):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                if key in state:
                    raise CheckpointError(f"tensor {key!r} appears in more than one shard")
                state[key] = f.get_tensor(key)
    return state


def check_keys(model: torch.nn.Module, state: dict[str, torch.Tensor], tied: bool) -> None:
    """Raise CheckpointError listing missing / unexpected / mis-shaped tensors."""
    expected = model.state_dict()
    optional = set(TIED_KEYS) if tied else set()
    missing = set(expected) - set(state) - optional
    unexpected = set(state) - set(expected)
    shape_bad = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in sorted(set(state) & set(expected))
        if tuple(state[k].shape) != tuple(expected[k].shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} tensor(s): {_fmt_keys(missing)}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} tensor(s): {_fmt_keys(unexpected)}")
    if shape_bad:
        problems.append(f"shape mismatch: {'; '.join(shape_bad[:8])}")
    if problems:
        raise CheckpointError("checkpoint does not match Qwen3ASRForConditionalGeneration: " + " | ".join(problems))


def load_config(folder: str | Path) -> Qwen3ASRConfig:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no config.json (not a checkpoint folder)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
    if "thinker_config" in raw:
        raise CheckpointError(
            f"{folder}: config.json is in the original qwen-asr layout (thinker_config, 'thinker.' weight "
            "names); transformers' Qwen3ASRForConditionalGeneration needs an HF-format ('-hf') checkpoint"
        )
    config = Qwen3ASRConfig.from_pretrained(str(folder))
    if config.model_type != "qwen3_asr":
        raise CheckpointError(f"{folder}: config model_type is {config.model_type!r}, expected 'qwen3_asr'")
    return config


def load_checkpoint(folder: str | Path) -> tuple[Qwen3ASRForConditionalGeneration, Qwen3ASRProcessor]:
    """Strictly load a folder: float32 eval model with exactly the file's weights + its processor."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {folder} does not exist")
    config = load_config(folder)
    state = read_state_dict(folder)
    # Built on CPU (buffers such as the audio sinusoids and RoPE inv_freq are computed by the
    # constructors), then every parameter is overwritten from the file after the key check.
    model = Qwen3ASRForConditionalGeneration(config)
    tied = bool(config.tie_word_embeddings)
    check_keys(model, state, tied)
    result = model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=False)
    if tied:
        model.tie_weights()
        stray = [k for k in result.missing_keys if k not in TIED_KEYS]
    else:
        stray = list(result.missing_keys)
    if stray or result.unexpected_keys:  # check_keys should have caught these
        raise CheckpointError(f"load_state_dict mismatch: {_fmt_keys(stray + list(result.unexpected_keys))}")
    model = model.float().eval()
    processor = load_processor(folder)
    return model, processor


def load_processor(folder: str | Path) -> Qwen3ASRProcessor:
    processor = AutoProcessor.from_pretrained(str(folder))
    if not isinstance(processor, Qwen3ASRProcessor):
        raise CheckpointError(f"{folder}: processor is {type(processor).__name__}, expected Qwen3ASRProcessor")
    return processor


def load(preset_or_ckpt: str | Path) -> tuple[Qwen3ASRForConditionalGeneration, Qwen3ASRProcessor]:
    """``"tiny"`` / ``"preset:tiny"`` -> the cached tiny preset folder; anything else is a folder path."""
    from .presets import PRESETS, preset_folder

    text = str(preset_or_ckpt)
    name = text.split(":", 1)[1] if text.startswith("preset:") else text
    if name in PRESETS and not Path(text).exists():
        if name == "real":
            raise CheckpointError("preset 'real' has no weights; pass a real checkpoint folder")
        return load_checkpoint(preset_folder(name))
    return load_checkpoint(Path(text))
