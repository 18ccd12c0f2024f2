"""The official qwen-asr checkpoint layout, declared as data, and its conversion to transformers'.

Why: the published Qwen3-ASR checkpoints are in the layout of the official ``qwen-asr`` package
(0.0.6): ``config.json`` nests everything under ``thinker_config``, weights are named
``thinker.*`` and the head is stored explicitly as ``thinker.lm_head.weight``. transformers 5.24
(our reference) names the same tensors differently and moves the audio output projections into
a ``multi_modal_projector``. Both directions are one declared table (no per-name code), and the
loader stays strict: a name no rule maps is an unexpected tensor, and the usual missing /
mis-shaped checks run on the renamed names.

Config facts used here (read in qwen-asr 0.0.6, core/transformers_backend):
* text RoPE is ``rope_theta`` + ``rope_scaling`` (M-RoPE sections). An ASR prompt has no image
  or video, so the official position ids are the same in all three sections and M-RoPE equals
  plain 1-D RoPE with that theta: ``rope_parameters = {rope_type: default, rope_theta}``.
  Any other ``rope_type`` is refused.
* the audio ``max_source_positions`` is the length of the sinusoid table; only its first
  rows are read, and a row does not depend on the table length, so it maps to transformers'
  ``max_position_embeddings``.
* ``conv_chunksize`` only batches the conv front-end (values unchanged) and is dropped.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

# Official weight-name prefix -> transformers prefix. Most specific first; the first match wins.
OFFICIAL_WEIGHT_PREFIXES: tuple[tuple[str, str], ...] = (
    ("thinker.audio_tower.proj1.", "model.multi_modal_projector.linear_1."),
    ("thinker.audio_tower.proj2.", "model.multi_modal_projector.linear_2."),
    ("thinker.audio_tower.", "model.audio_tower."),
    ("thinker.model.", "model.language_model."),
    ("thinker.lm_head.", "lm_head."),
)

# Audio-config field renames (official -> transformers) and fields with no effect on values.
OFFICIAL_AUDIO_RENAMES: dict[str, str] = {"max_source_positions": "max_position_embeddings"}
OFFICIAL_AUDIO_DROPPED: tuple[str, ...] = ("conv_chunksize",)
# Top-level transformers field -> where the official config holds it.
OFFICIAL_TOP_FIELDS: dict[str, str] = {
    "audio_token_id": "thinker_config.audio_token_id",
    "tie_word_embeddings": "thinker_config.text_config.tie_word_embeddings",
}
# transformers field path -> official field path, for error messages that name the user's file.
OFFICIAL_FIELD_NAMES: dict[str, str] = {
    **{f"audio_config.{new}": f"thinker_config.audio_config.{old}" for old, new in OFFICIAL_AUDIO_RENAMES.items()},
    "text_config.rope_parameters.rope_theta": "thinker_config.text_config.rope_theta",
    **OFFICIAL_TOP_FIELDS,
}
SUPPORTED_ROPE_TYPES = (None, "default")


def is_official_config(raw: Mapping[str, Any]) -> bool:
    """The official layout nests the model under ``thinker_config``."""
    return "thinker_config" in raw


def _rename(name: str, table: tuple[tuple[str, str], ...]) -> str | None:
    for old, new in table:
        if name.startswith(old):
            return new + name[len(old):]
    return None


def official_to_hf_name(name: str) -> str | None:
    """Official tensor name -> transformers name; None when no rule covers it (unexpected)."""
    return _rename(name, OFFICIAL_WEIGHT_PREFIXES)


def hf_to_official_name(name: str) -> str | None:
    """transformers tensor name -> official name; None when no rule covers it."""
    return _rename(name, tuple((new, old) for old, new in OFFICIAL_WEIGHT_PREFIXES))


def field_name(hf_path: str, official: bool) -> str:
    """How the user's config.json spells a field: the official path for an official file."""
    if not official:
        return hf_path
    if hf_path in OFFICIAL_FIELD_NAMES:
        return OFFICIAL_FIELD_NAMES[hf_path]
    head = hf_path.split(".", 1)[0]
    return f"thinker_config.{hf_path}" if head in ("audio_config", "text_config") else hf_path


def get_field(raw: Mapping[str, Any], dotted: str) -> Any:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def official_to_hf_config(raw: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """The official ``config.json`` as a transformers ``Qwen3ASRConfig`` dict. Missing fields stay
    missing (the strict field check reports them); an unsupported RoPE type is an error."""
    thinker = raw.get("thinker_config")
    if not isinstance(thinker, Mapping):
        raise ValueError(f"{path}: thinker_config must be an object")
    audio = dict(copy.deepcopy(thinker.get("audio_config") or {}))
    text = dict(copy.deepcopy(thinker.get("text_config") or {}))
    for old, new in OFFICIAL_AUDIO_RENAMES.items():
        if old in audio:
            audio[new] = audio.pop(old)
    for key in OFFICIAL_AUDIO_DROPPED:
        audio.pop(key, None)
    scaling = text.pop("rope_scaling", None) or {}
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"{path}: thinker_config.text_config.rope_scaling.rope_type {rope_type!r} is not "
                         "supported (only default / M-RoPE with equal sections, which is 1-D RoPE for audio+text)")
    if "rope_theta" in text:
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": text.pop("rope_theta")}
    audio["model_type"] = "qwen3_asr_encoder"
    text["model_type"] = "qwen3"
    out: dict[str, Any] = {"model_type": "qwen3_asr", "audio_config": audio, "text_config": text}
    for hf_key, official_path in OFFICIAL_TOP_FIELDS.items():
        value = get_field(raw, official_path)
        if value is not None:
            out[hf_key] = value
    return out


def mrope_sections(head_dim: int) -> list[int]:
    """M-RoPE sections (temporal, height, width) over head_dim / 2 frequencies in the published
    proportions (24, 20, 20 of 64). The official model needs them in its config; with the equal
    position ids of an ASR prompt any split gives the same rotation."""
    half = head_dim // 2
    side = half * 5 // 16
    return [half - 2 * side, side, side]


def hf_to_official_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """A transformers ``Qwen3ASRConfig`` dict in the official layout (the inverse of
    :func:`official_to_hf_config`), for writing folders the official package loads."""
    audio = {k: v for k, v in copy.deepcopy(dict(hf["audio_config"])).items() if k != "model_type"}
    text = {k: v for k, v in copy.deepcopy(dict(hf["text_config"])).items() if k != "model_type"}
    for old, new in OFFICIAL_AUDIO_RENAMES.items():
        if new in audio:
            audio[old] = audio.pop(new)
    rope = text.pop("rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_type {rope.get('rope_type')!r} has no official equivalent")
    text["rope_theta"] = rope["rope_theta"]
    text["rope_scaling"] = {"rope_type": "default", "mrope_section": mrope_sections(int(text["head_dim"])),
                            "interleaved": True, "mrope_interleaved": True}
    text["tie_word_embeddings"] = bool(hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    return {
        "architectures": ["Qwen3ASRForConditionalGeneration"],
        "model_type": "qwen3_asr",
        "thinker_config": {"audio_config": audio, "text_config": text, "audio_token_id": hf["audio_token_id"],
                           "model_type": "qwen3_asr_thinker"},
    }
