"""Configuration of the Youtu-VL port: vision tower, merger, LLM, processor and special ids.

Why a dataclass of our own: the official ``configuration_youtu_vl.py`` is remote code that is not
available here, so the port owns one typed record that both the PyTorch reference and the host
runtime read, and that round-trips through an HF-style ``config.json`` (LLM fields at the top
level, tower fields under ``vision_config``), which is how a checkpoint folder identifies itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

# Real special token ids (spec section 3); the tiny tokenizer keeps them at the same ids.
BOS_ID = 128000
EOS_ID = 128001
VISION_START_ID = 128262
VISION_END_ID = 128263
IMAGE_PAD_ID = 128264
VIDEO_PAD_ID = 128265

SPECIAL_TOKENS: dict[str, int] = {
    "<|begin_of_text|>": BOS_ID,
    "<|end_of_text|>": EOS_ID,
    "<|vision_start|>": VISION_START_ID,
    "<|vision_end|>": VISION_END_ID,
    "<|image_pad|>": IMAGE_PAD_ID,
    "<|video_pad|>": VIDEO_PAD_ID,
}


@dataclass(frozen=True)
class VisionConfig:
    """SigLIP2-style tower with 2D RoPE and Qwen2.5-VL-style window attention (spec section 4)."""

    hidden_size: int = 1152
    num_hidden_layers: int = 27
    num_attention_heads: int = 16
    intermediate_size: int = 4304
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6
    patch_size: int = 16
    num_channels: int = 3
    spatial_merge_size: int = 2
    window_size: int = 256  # pixels: 8x8 merged tokens at patch 16, merge 2
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 26)
    rope_theta: float = 10000.0
    out_hidden_size: int = 2560

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patch_dim(self) -> int:
        return self.patch_size * self.patch_size * self.num_channels

    @property
    def window_tokens(self) -> int:
        """Side of a window in merged tokens (``vws`` in the spec)."""
        return self.window_size // self.spatial_merge_size // self.patch_size

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2

    def validate(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("vision hidden_size must be divisible by num_attention_heads")
        if self.head_dim % 4:
            raise ValueError(f"vision head_dim {self.head_dim} must be divisible by 4 "
                             "(h and w halves of the 2D RoPE need whole frequency pairs)")
        if self.window_tokens < 1:
            raise ValueError("window_size is smaller than one merged token")
        last = self.num_hidden_layers - 1
        if any(i < 0 or i > last for i in self.fullatt_block_indexes):
            raise ValueError(f"fullatt_block_indexes {self.fullatt_block_indexes} out of range")


@dataclass(frozen=True)
class TextConfig:
    """The Youtu-LLM (MLA) decoder; fields named as transformers' ``YoutuConfig``."""

    vocab_size: int = 283386
    hidden_size: int = 2560
    intermediate_size: int = 9728
    num_hidden_layers: int = 40
    num_attention_heads: int = 32
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    rope_theta: float = 500000.0
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_interleave: bool = True
    tie_word_embeddings: bool = True

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def to_hf(self) -> Any:
        """The transformers ``YoutuConfig`` (eager attention: the official model does not support SDPA)."""
        from transformers import YoutuConfig

        cfg = YoutuConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_attention_heads,
            q_lora_rank=self.q_lora_rank, kv_lora_rank=self.kv_lora_rank,
            qk_nope_head_dim=self.qk_nope_head_dim, qk_rope_head_dim=self.qk_rope_head_dim,
            v_head_dim=self.v_head_dim, max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps, rope_interleave=self.rope_interleave,
            tie_word_embeddings=self.tie_word_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            bos_token_id=BOS_ID, eos_token_id=EOS_ID,
        )
        cfg._attn_implementation = "eager"
        return cfg

    def validate(self) -> None:
        if self.vocab_size <= max(SPECIAL_TOKENS.values()):
            raise ValueError(f"vocab_size {self.vocab_size} must exceed the special ids "
                             f"(<= {max(SPECIAL_TOKENS.values())})")
        if self.qk_rope_head_dim % 2:
            raise ValueError("qk_rope_head_dim must be even")


@dataclass(frozen=True)
class ProcessorConfig:
    """Image preprocessing of the model card's HF processor (spec section 2).

    ``max_num_patches = 36864``: ``YoutuVLProcessor.__call__`` (processing_youtu_vl.py, the
    processor the model card ships) passes ``max_image_patches=36864`` to the SigLIP2 fast image
    processor, overriding ``"max_num_patches": 256`` of preprocessor_config.json (quoted by
    lablup/mlxcel's HF oracle and by openvino.genai's Youtu-VL port). The 49152 of Tencent's
    vLLM fork belongs to its own image-processor rewrite (no antialias either), not the HF one,
    so it is not used here. mean = std = 0.5 and the 0.02 scale step are that file's values.
    """

    max_num_patches: int = 36864
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    scale_step: float = 0.02


@dataclass(frozen=True)
class YoutuVLConfig:
    vision: VisionConfig = field(default_factory=VisionConfig)
    text: TextConfig = field(default_factory=TextConfig)
    processor: ProcessorConfig = field(default_factory=ProcessorConfig)
    system_prompt: str = "You are a helpful assistant."

    def validate(self) -> None:
        self.vision.validate()
        self.text.validate()
        if self.vision.out_hidden_size != self.text.hidden_size:
            raise ValueError(f"vision out_hidden_size {self.vision.out_hidden_size} != LLM hidden "
                             f"{self.text.hidden_size}")

    # --- config.json ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """HF-style config.json: LLM fields at the top level, the tower under ``vision_config``."""
        text = dataclasses.asdict(self.text)
        vision = dataclasses.asdict(self.vision)
        vision["fullatt_block_indexes"] = list(self.vision.fullatt_block_indexes)
        proc = dataclasses.asdict(self.processor)
        return {
            "architectures": ["YoutuVLForConditionalGeneration"],
            "model_type": "youtu_vl",
            **text,
            "vision_config": vision,
            "processor_config": {k: list(v) if isinstance(v, tuple) else v for k, v in proc.items()},
            "system_prompt": self.system_prompt,
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
            "image_token_id": IMAGE_PAD_ID,
            "vision_start_token_id": VISION_START_ID,
            "vision_end_token_id": VISION_END_ID,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = "config.json") -> "YoutuVLConfig":
        """Read a checkpoint's config.json strictly: every field the port uses must be there.

        Why strict: a missing field silently taking our default (rope theta, norm eps, max
        positions, ...) builds a different model whose parity numbers still look plausible.
        Required are the fields the official config classes declare (``REQUIRED_*``; names as
        in Tencent's vLLM ``YoutuVLConfig`` / ``Siglip2VisionConfig``, whose defaults are generic
        placeholders, not this model's values). ``MODELLING_CONSTANTS`` are fixed in the official
        modelling code rather than declared config fields, so their absence means the official
        value; ``tie_word_embeddings`` absent means HF's ``PretrainedConfig`` default (True),
        which ``save_pretrained`` drops from the file. ``source`` names the file in errors.
        """
        if data.get("model_type") != "youtu_vl":
            raise ValueError(f"{source}: model_type {data.get('model_type')!r} is not youtu_vl")
        _check_special_ids(data, source)
        text_src = dict(data.get("text_config", data))
        if "rope_theta" not in text_src and isinstance(text_src.get("rope_parameters"), Mapping):
            if "rope_theta" in text_src["rope_parameters"]:
                text_src["rope_theta"] = text_src["rope_parameters"]["rope_theta"]
        text_src.setdefault("tie_word_embeddings", True)
        text = TextConfig(**_required(text_src, REQUIRED_TEXT, source, ""))
        if "vision_config" not in data:
            raise ValueError(f"{source}: missing field 'vision_config'")
        vsrc = dict(data["vision_config"])
        vision_kw = _required(vsrc, REQUIRED_VISION, source, "vision_config.")
        for name, official in MODELLING_CONSTANTS.items():
            vision_kw[name] = vsrc.get(name, official)
        vision_kw["fullatt_block_indexes"] = tuple(vision_kw["fullatt_block_indexes"])
        vision = VisionConfig(**vision_kw)
        psrc = dict(data.get("processor_config", {}))
        for k in ("image_mean", "image_std"):
            if k in psrc:
                psrc[k] = tuple(psrc[k])
        proc = _pick(ProcessorConfig, psrc)
        cfg = cls(vision=vision, text=text, processor=proc,
                  system_prompt=data.get("system_prompt", cls.system_prompt))
        cfg.validate()
        return cfg


# config.json fields the port reads, as the official config classes name them (top level /
# ``text_config``, and ``vision_config``): each must be present.
REQUIRED_TEXT = tuple(f.name for f in dataclasses.fields(TextConfig))
REQUIRED_VISION = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                   "hidden_act", "layer_norm_eps", "patch_size", "num_channels", "out_hidden_size")
# Vision-tower values the official modelling code fixes instead of reading a declared config
# field (spec section 4; the vLLM port derives fullatt as (i+1) % 8 == 0 or the last layer).
MODELLING_CONSTANTS: dict[str, Any] = {
    "spatial_merge_size": 2, "window_size": 256, "fullatt_block_indexes": (7, 15, 23, 26),
    "rope_theta": 10000.0,
}
# Special ids the prompt and the vision fusion rely on (names as in the official config class).
REQUIRED_IDS = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "image_token_id": IMAGE_PAD_ID,
                "vision_start_token_id": VISION_START_ID, "vision_end_token_id": VISION_END_ID}


def _required(src: Mapping[str, Any], names: tuple[str, ...], source: str, prefix: str) -> dict[str, Any]:
    """``{name: src[name]}`` for ``names``; the first missing one is a ValueError naming it."""
    for name in names:
        if name not in src or src[name] is None:
            raise ValueError(f"{source}: missing field '{prefix}{name}' (no default is assumed)")
    return {name: src[name] for name in names}


def _check_special_ids(data: Mapping[str, Any], source: str) -> None:
    """Every special id must be present and equal to the id the tokenizer and prompt use."""
    for key, want in REQUIRED_IDS.items():
        if key not in data:
            raise ValueError(f"{source}: missing field '{key}' (this port expects {want})")
        if data[key] != want:
            raise ValueError(f"{source}: {key}={data[key]} but this port expects {want}")


def check_positions(prompt_tokens: int, max_new_tokens: int, cfg: YoutuVLConfig) -> None:
    """Refuse a generation whose last position would pass ``max_position_embeddings``.

    Why: past that length the official model is outside what it was trained and configured
    for (RoPE tables, cache sizes), so a port that silently continues gives numbers nobody can
    compare; the prompt length counts every ``<|image_pad|>``.
    """
    limit = cfg.text.max_position_embeddings
    if prompt_tokens + max_new_tokens > limit:
        raise ValueError(f"prompt of {prompt_tokens} tokens + {max_new_tokens} new tokens exceeds the "
                         f"model's max positions ({limit}, config max_position_embeddings)")


def _pick(kind: type, src: Mapping[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(kind)}
    return kind(**{k: v for k, v in src.items() if k in names})


def tiny_config() -> YoutuVLConfig:
    """Small dims in the real proportions (spec section 11).

    Vision head_dim 16 (divisible by 4), window 256 px = 8x8 merged tokens as in the real model,
    full attention on layers 1 and 3 (the last). LLM MLA ranks keep the real ratios to the hidden
    size (q_lora 0.6x, kv_lora 0.2x; nope:rope:v = 2:1:2), rope_interleave on, and the vocabulary
    is just large enough to keep the real special ids.
    """
    text = TextConfig(vocab_size=128266, hidden_size=80, intermediate_size=304, num_hidden_layers=3,
                      num_attention_heads=4, q_lora_rank=48, kv_lora_rank=16, qk_nope_head_dim=16,
                      qk_rope_head_dim=8, v_head_dim=16, max_position_embeddings=4096)
    vision = VisionConfig(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                          intermediate_size=240, fullatt_block_indexes=(1, 3), out_hidden_size=80)
    return YoutuVLConfig(vision=vision, text=text)


def mid_config() -> YoutuVLConfig:
    """Real widths (vision 1152/16 heads/head_dim 72, LLM 2560 with real MLA ranks) but few layers:
    checks the real head dims and RoPE sizes in ncnn without a 4B checkpoint (manual runs only)."""
    real = YoutuVLConfig()
    vision = dataclasses.replace(real.vision, num_hidden_layers=4, fullatt_block_indexes=(1, 3))
    text = dataclasses.replace(real.text, vocab_size=128266, num_hidden_layers=2)
    return YoutuVLConfig(vision=vision, text=text)


def real_config() -> YoutuVLConfig:
    """The real Youtu-VL-4B-Instruct dims (spec sections 4 and 7). Never instantiated in tests."""
    return YoutuVLConfig()


PRESETS = {"tiny": tiny_config, "mid": mid_config, "real": real_config}


def preset_config(name: str) -> YoutuVLConfig:
    if name not in PRESETS:
        raise KeyError(f"unknown youtu-vl preset {name!r}; known: {', '.join(PRESETS)}")
    cfg = PRESETS[name]()
    cfg.validate()
    return cfg
