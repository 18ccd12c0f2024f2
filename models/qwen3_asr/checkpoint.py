"""Write and strictly load Qwen3-ASR checkpoint folders (HF layout, safetensors only).

Why: parity numbers are only meaningful if the torch reference holds exactly the weights of the
folder; HF's ``from_pretrained`` warns and random-initialises on missing keys. Here a missing or
unexpected tensor is an error that names the keys. Weights are read with ``safetensors`` only:
no ``torch.load`` (pickle) of user files, ever.

Folder layout (same as a real checkpoint): ``config.json``, ``model.safetensors`` (or
``model.safetensors.index.json`` + shards), tokenizer files, ``processor_config.json`` /
``preprocessor_config.json`` and ``chat_template.jinja``. Both the transformers layout and the
official qwen-asr layout (``thinker_config``, ``thinker.*`` names) load, the latter through the
declared rename tables of :mod:`.official_layout`.

Configs are strict too: every field the model or the runtime reads (:data:`REQUIRED_FIELDS`)
must be in the folder's config.json; a missing one is an error naming the field and the file,
never a class default (transformers' default RoPE theta is 10000, the model's is 1e6).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (
    AutoProcessor,
    Qwen3ASRConfig,
    Qwen3ASRForConditionalGeneration,
    Qwen3ASRProcessor,
)

from ncnnport.fsutil import read_json_object
from ncnnport.lazy_weights import WEIGHTS_NAME, checkpoint_shards

from . import official_layout

# Tied to the embedding when config.tie_word_embeddings: may be absent (or present) in a file.
TIED_KEYS = ("lm_head.weight",)
EMBED_KEY = "model.language_model.embed_tokens.weight"


class CheckpointError(ValueError):
    """A checkpoint folder is incomplete or does not match the architecture."""


# Every config field the model or the runtime reads (transformers spelling; official files are
# checked under their own names). eos_token_id may also come from generation_config.json.
REQUIRED_FIELDS: tuple[str, ...] = (
    "audio_token_id",
    "tie_word_embeddings",
    "text_config.vocab_size",
    "text_config.hidden_size",
    "text_config.intermediate_size",
    "text_config.num_hidden_layers",
    "text_config.num_attention_heads",
    "text_config.num_key_value_heads",
    "text_config.head_dim",
    "text_config.hidden_act",
    "text_config.rms_norm_eps",
    "text_config.max_position_embeddings",
    "text_config.rope_parameters.rope_theta",
    "audio_config.num_mel_bins",
    "audio_config.encoder_layers",
    "audio_config.encoder_attention_heads",
    "audio_config.encoder_ffn_dim",
    "audio_config.d_model",
    "audio_config.downsample_hidden_size",
    "audio_config.output_dim",
    "audio_config.n_window",
    "audio_config.n_window_infer",
    "audio_config.max_position_embeddings",
    "audio_config.activation_function",
)
GENERATION_CONFIG = "generation_config.json"


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
    make_tokenizer_config_portable(folder)
    return folder


def make_tokenizer_config_portable(folder: str | Path) -> None:
    """Rewrite the folder's tokenizer_config.json in the form both transformers 5.24 and the
    official package (transformers 4.57.6) load (see :func:`official_tokenizer_config`)."""
    path = Path(folder) / "tokenizer_config.json"
    path.write_text(json.dumps(official_tokenizer_config(_read_json(path)), indent=2))


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


def official_name_map(names: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """({transformers name: official name}, official names no rule maps) for a tensor list."""
    mapping: dict[str, str] = {}
    unmapped: list[str] = []
    for name in names:
        new = official_layout.official_to_hf_name(name)
        if new is None:
            unmapped.append(name)
        else:
            mapping[new] = name
    return mapping, unmapped


def rename_official_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An official-layout state dict under transformers names; a tensor no rule maps is an
    error naming it (strict, like any unexpected tensor)."""
    mapping, unmapped = official_name_map(state)
    if unmapped:
        raise CheckpointError(f"checkpoint (official layout) has unexpected {len(unmapped)} tensor(s): "
                              f"{_fmt_keys(unmapped)}")
    return {new: state[old] for new, old in mapping.items()}


def check_tied_head(state: dict[str, torch.Tensor], tied: bool) -> None:
    """With tied embeddings an explicit head (official checkpoints store one) must equal the
    embedding: the tie would otherwise silently discard the file's head."""
    head, embed = state.get(TIED_KEYS[0]), state.get(EMBED_KEY)
    if not tied or head is None or embed is None or head.shape != embed.shape:
        return
    if not torch.equal(head.to(torch.float32), embed.to(torch.float32)):
        raise CheckpointError(f"config ties the head to the embedding but {TIED_KEYS[0]} differs from {EMBED_KEY} "
                              "in the file; set tie_word_embeddings false to use the file's head")


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


def _read_json(path: Path) -> dict:
    return read_json_object(path, CheckpointError)


def is_official_folder(folder: str | Path) -> bool:
    """True when the folder's config.json is in the official qwen-asr layout."""
    path = Path(folder) / "config.json"
    return path.is_file() and official_layout.is_official_config(_read_json(path))


# Token ids a folder may keep in generation_config.json instead of config.json (the official
# layout does): used only when config.json lacks them.
GENERATION_FIELDS: tuple[str, ...] = ("eos_token_id", "pad_token_id")


def _with_generation_fields(raw: dict, folder: Path) -> dict:
    path = folder / GENERATION_CONFIG
    if not path.is_file():
        return raw
    gen = _read_json(path)
    extra = {k: gen[k] for k in GENERATION_FIELDS if raw.get(k) is None and gen.get(k) is not None}
    return {**raw, **extra}


def check_required_fields(raw: dict, path: Path, official: bool) -> None:
    """Raise CheckpointError naming every required field absent from ``raw`` (the config as
    transformers spells it) and the file, in the file's own spelling."""
    missing = [official_layout.field_name(f, official) for f in REQUIRED_FIELDS
               if official_layout.get_field(raw, f) is None]
    if missing:
        raise CheckpointError(f"{path}: missing required config field(s): {', '.join(missing)} "
                              "(no defaults are assumed)")
    if raw.get("eos_token_id") is None:
        raise CheckpointError(f"{path}: missing required config field eos_token_id (also not in "
                              f"{path.parent / GENERATION_CONFIG})")


def read_config_dict(folder: str | Path) -> tuple[dict, bool]:
    """(config as a transformers dict, official layout?) of a folder, strictly checked."""
    folder = Path(folder)
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no config.json (not a checkpoint folder)")
    raw = _read_json(path)
    official = official_layout.is_official_config(raw)
    if official:
        try:
            raw = official_layout.official_to_hf_config(raw, path)
        except ValueError as exc:
            raise CheckpointError(str(exc)) from exc
    if raw.get("model_type") != "qwen3_asr":
        raise CheckpointError(f"{path}: config model_type is {raw.get('model_type')!r}, expected 'qwen3_asr'")
    raw = _with_generation_fields(raw, folder)
    check_required_fields(raw, path, official)
    return raw, official


def load_config(folder: str | Path) -> Qwen3ASRConfig:
    """The folder's Qwen3ASRConfig (either layout), with every required field from the file."""
    raw, _ = read_config_dict(folder)
    fields = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version", "architectures")}
    try:
        return Qwen3ASRConfig(**fields)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{Path(folder) / 'config.json'}: {exc}") from exc


def load_checkpoint(folder: str | Path) -> tuple[Qwen3ASRForConditionalGeneration, Qwen3ASRProcessor]:
    """Strictly load a folder: float32 eval model with exactly the file's weights + its processor."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {folder} does not exist")
    config = load_config(folder)
    state = read_state_dict(folder)
    if is_official_folder(folder):
        state = rename_official_state(state)
    # Built on CPU (buffers such as the audio sinusoids and RoPE inv_freq are computed by the
    # constructors), then every parameter is overwritten from the file after the key check.
    model = Qwen3ASRForConditionalGeneration(config)
    tied = bool(config.tie_word_embeddings)
    check_keys(model, state, tied)
    check_tied_head(state, tied)
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


# The official processor's feature extractor (WhisperFeatureExtractor) must compute what
# transformers' Qwen3ASRFeatureExtractor computes: these fields of preprocessor_config.json.
OFFICIAL_FEATURE_FIELDS: dict[str, Any] = {"feature_size": 128, "sampling_rate": 16000, "hop_length": 160,
                                           "n_fft": 400}
PREPROCESSOR_CONFIG = "preprocessor_config.json"


def apply_official_audio_rules(processor: Qwen3ASRProcessor) -> Qwen3ASRProcessor:
    """Make transformers' feature extractor pad a single clip the way the official pipeline
    does: not at all. transformers pads every clip below ``min_length`` (8000 samples) to 0.5 s;
    the official ``transcribe()`` pads only the chunks of a cut input (done by
    ``chunking.split_audio``) and its WhisperFeatureExtractor pads nothing, so a 0.2 s clip is
    20 mel frames there, not 50."""
    processor.feature_extractor.min_length = 0
    return processor


def _official_processor(folder: Path) -> Qwen3ASRProcessor:
    """transformers' processor over an official folder's tokenizer, chat template and a feature
    extractor equal to its WhisperFeatureExtractor (fields checked, mismatch = error)."""
    from transformers import AutoTokenizer, Qwen3ASRFeatureExtractor

    path = folder / PREPROCESSOR_CONFIG
    if not path.is_file():
        raise CheckpointError(f"{folder}: no {PREPROCESSOR_CONFIG} (official layout needs it)")
    raw = _read_json(path)
    wrong = [f"{k}={raw.get(k)!r} (expected {v!r})" for k, v in OFFICIAL_FEATURE_FIELDS.items() if raw.get(k) != v]
    if wrong:
        raise CheckpointError(f"{path}: unsupported feature extractor settings: {', '.join(wrong)}")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    template = tokenizer.chat_template
    for name in ("chat_template.jinja",):
        if (folder / name).is_file():
            template = (folder / name).read_text()
    if template is None:
        raise CheckpointError(f"{folder}: no chat template (chat_template.jinja or tokenizer_config.json)")
    return Qwen3ASRProcessor(feature_extractor=Qwen3ASRFeatureExtractor(), tokenizer=tokenizer, chat_template=template)


def load_processor(folder: str | Path) -> Qwen3ASRProcessor:
    """The folder's processor (either layout) with the official audio rules applied."""
    folder = Path(folder)
    if is_official_folder(folder):
        processor = _official_processor(folder)
    else:
        processor = AutoProcessor.from_pretrained(str(folder))
    if not isinstance(processor, Qwen3ASRProcessor):
        raise CheckpointError(f"{folder}: processor is {type(processor).__name__}, expected Qwen3ASRProcessor")
    return apply_official_audio_rules(processor)


def official_tokenizer_config(tokenizer_config: dict) -> dict:
    """A tokenizer_config.json both transformers 5.24 and the official package's 4.57.6 load:
    the Qwen2 fast tokenizer class and the audio tokens under ``extra_special_tokens`` as a dict
    (4.57 reads named extra tokens only from a dict; a list of them fails there)."""
    named = {k: tokenizer_config[k] for k in ("audio_token", "audio_bos_token", "audio_eos_token")
             if k in tokenizer_config}
    out = {k: v for k, v in tokenizer_config.items() if k not in ("backend",)}
    out["tokenizer_class"] = "Qwen2TokenizerFast"
    out["extra_special_tokens"] = named
    return out


def write_official_folder(model: Qwen3ASRForConditionalGeneration, processor: Qwen3ASRProcessor,
                          folder: str | Path) -> Path:
    """Write ``model`` + ``processor`` in the official qwen-asr layout: thinker_config config,
    ``thinker.*`` weights with an explicit ``thinker.lm_head.weight``, a WhisperFeatureExtractor
    preprocessor_config.json, generation_config.json with the eos ids, tokenizer files the
    official package loads."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hf = model.config.to_dict()
    (folder / "config.json").write_text(json.dumps(official_layout.hf_to_official_config(hf), indent=2))
    state = {}
    for name, tensor in model.state_dict().items():
        new = official_layout.hf_to_official_name(name)
        if new is None:
            raise CheckpointError(f"no official name for tensor {name!r}")
        state[new] = tensor.detach().to(torch.float32).contiguous().clone()
    save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    eos = hf.get("eos_token_id")
    (folder / GENERATION_CONFIG).write_text(json.dumps({"eos_token_id": eos, "pad_token_id": hf.get("pad_token_id"),
                                                        "do_sample": False}, indent=2))
    fe = processor.feature_extractor
    (folder / PREPROCESSOR_CONFIG).write_text(json.dumps({
        "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": fe.feature_size,
        "sampling_rate": fe.sampling_rate, "hop_length": fe.hop_length, "n_fft": fe.n_fft,
        "chunk_length": 30, "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
        "padding_value": 0.0, "return_attention_mask": True, "dither": 0.0,
        "processor_class": "Qwen3ASRProcessor"}, indent=2))
    processor.tokenizer.save_pretrained(str(folder))
    tok_path = folder / "tokenizer_config.json"
    tok_cfg = official_tokenizer_config(_read_json(tok_path))
    tok_cfg["chat_template"] = processor.chat_template
    tok_path.write_text(json.dumps(tok_cfg, indent=2))
    (folder / "chat_template.jinja").write_text(processor.chat_template)
    return folder
