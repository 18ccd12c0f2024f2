"""Presets of the real Qwen3-ASR architecture: a seeded ``tiny`` one for tests and the ``real`` config.

Why: nothing can be downloaded, yet every stage (export, convert, parity, runtime) must run on the
exact HF module classes. The ``tiny`` preset is ``Qwen3ASRForConditionalGeneration`` with small
dims but the real structure: GQA with per-head q/k RMSNorm, the 3x stride-2 conv front-end on
100-frame mel chunks, the real windowing (``n_window=50``, ``n_window_infer=800``: 104 tokens per
attention window) and 128 mel bins.

Weights are re-initialised (seeded) so greedy decoding is informative. Two measured facts drive
this: (1) HF's default std 0.02 makes a tiny model emit one token forever; (2) even at std
0.15-0.2 it still degenerates on longer audio (12-65 s: one token 64 times), because with unit
q/k RMSNorm weights the decoder's attention logits have std ~1, so attention over hundreds of
audio tokens is a near-uniform average, the state stops depending on the history, and decoding
becomes a fixed token -> token map that falls into a cycle. Trained Qwen3 models have sharp
attention; giving the per-head q/k RMSNorm weights a gain of ~3 (seeded +-20 % spread) restores
it. Measured over 26 inputs (speech-like 1-65 s incl. cut chunks and noise, with and without a
forced language, 64 greedy tokens): std 0.15 + q/k gain 3 gave >= 42 distinct tokens and runs
of <= 8 identical tokens on every input for seeds 0-3 (seed 0: >= 50 distinct, runs <= 4),
while at gain 1 every seed had inputs that repeated a single token 64 times.

``write_preset_folder`` writes the preset as a checkpoint folder (config.json, model.safetensors,
tokenizer and processor files), so the runtime loads the tiny preset exactly as a real checkpoint.
The ``real`` preset is the Qwen3-ASR-0.6B config with seeded per-tensor weights generated one
module at a time (``lazy.py``); its folder holds config + processor only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from torch import nn
from transformers import (
    Qwen3ASRConfig,
    Qwen3ASRFeatureExtractor,
    Qwen3ASRForConditionalGeneration,
    Qwen3ASRProcessor,
)

from ncnnport.paths import preset_cache_root
from ncnnport.tiny_tokenizer import build_tiny_tokenizer

PRESETS: tuple[str, ...] = ("tiny", "real")
CORPUS_FILE = Path(__file__).with_name("tiny_corpus.txt")
TINY_SEED = 0
TINY_INIT_STD = 0.15
TINY_QK_NORM_GAIN = 3.0

# Special tokens of the tiny tokenizer, with the same names and roles as the real Qwen3 vocabulary
# (real ids: <|endoftext|> 151643, <|im_start|> 151644, <|im_end|> 151645, <|audio_pad|> 151676);
# the tiny ids sit right above the trained BPE so the embedding table stays small.
TINY_BPE_VOCAB = 512
TINY_SPECIAL_IDS: dict[str, int] = {
    "<|endoftext|>": 512,
    "<|im_start|>": 513,
    "<|im_end|>": 514,
    "<|audio_start|>": 515,
    "<|audio_end|>": 516,
    "<|audio_pad|>": 517,
    "<asr_text>": 518,
    "<timestamp>": 519,
}
# `<asr_text>` is an added but not special token in Qwen3-ASR: the output parser looks for it
# after decoding with skip_special_tokens=True.
TINY_NON_SPECIAL: tuple[str, ...] = ("<asr_text>",)
TINY_TEXT_VOCAB = 528  # >= len(tokenizer); rows above the tokenizer are unused like in Qwen3

# Chat template reproducing the official Qwen3-ASR prompt layout: a system turn (context text,
# empty by default) always present, the user turn holding <|audio_start|><|audio_pad|><|audio_end|>
# (the processor expands <|audio_pad|> to one token per encoder output), then the assistant turn.
# A forced language arrives as assistant prefill "language X<asr_text>" (continue_final_message).
CHAT_TEMPLATE = (
    "{%- if not messages or messages[0]['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\n<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'audio' or 'audio' in item or 'audio_url' in item -%}"
    "{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif item['type'] == 'text' -%}"
    "{{- item['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)


def tiny_config() -> Qwen3ASRConfig:
    """Small dims, real structure (GQA 4/2 heads, q/k norm, conv front-end, real windowing)."""
    ids = TINY_SPECIAL_IDS
    return Qwen3ASRConfig(
        audio_config={
            "model_type": "qwen3_asr_encoder",
            "num_mel_bins": 128,
            "encoder_layers": 2,
            "encoder_attention_heads": 4,
            "encoder_ffn_dim": 128,
            "d_model": 64,
            "downsample_hidden_size": 16,
            "output_dim": 96,
            "n_window": 50,
            "n_window_infer": 800,
            "max_position_embeddings": 13,
            "activation_function": "gelu",
        },
        text_config={
            "model_type": "qwen3",
            "vocab_size": TINY_TEXT_VOCAB,
            "hidden_size": 96,
            "intermediate_size": 192,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 24,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "tie_word_embeddings": True,
            "hidden_act": "silu",
        },
        audio_token_id=ids["<|audio_pad|>"],
        timestamp_token_id=ids["<timestamp>"],
        pad_token_id=ids["<|im_end|>"],
        eos_token_id=[ids["<|endoftext|>"], ids["<|im_end|>"]],
        tie_word_embeddings=True,
    )


def real_config() -> Qwen3ASRConfig:
    """Qwen3-ASR-0.6B dimensions as published in its config (audio d_model 896 x 18 layers x 14
    heads, ffn 3584, conv 480, output 1024; text Qwen3 1024 x 28 layers, 16/8 heads, head_dim 128,
    ffn 3072, vocab 151936, tied). The original checkpoint uses M-RoPE sections for text; the
    transformers port uses plain 1D RoPE. A checkpoint's own config.json always wins on load."""
    return Qwen3ASRConfig(
        audio_config={
            "model_type": "qwen3_asr_encoder",
            "num_mel_bins": 128,
            "encoder_layers": 18,
            "encoder_attention_heads": 14,
            "encoder_ffn_dim": 3584,
            "d_model": 896,
            "downsample_hidden_size": 480,
            "output_dim": 1024,
            "n_window": 50,
            "n_window_infer": 800,
            "max_position_embeddings": 13,
        },
        text_config={
            "model_type": "qwen3",
            "vocab_size": 151936,
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 65536,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "tie_word_embeddings": True,
        },
        audio_token_id=151676,
        timestamp_token_id=151705,
        pad_token_id=151645,
        eos_token_id=[151643, 151645],
        tie_word_embeddings=True,
    )


# The ``real`` preset: Qwen3-ASR-0.6B dims with seeded per-tensor weights (ncnnport.lazy_weights).
# The tiny recipe scaled to real widths: tiny's Linear std 0.15 at fan-in 96 is a gain of
# 0.15 * sqrt(96) ~ 1.47 per unit-variance input, so every Linear / Conv / Embedding weight gets
# std = REAL_INIT_GAIN / sqrt(fan_in) (Conv fan-in = in_channels * kh * kw; the embedding uses the
# hidden width, which keeps the tied head's logit spread at tiny's ~1.5), biases std / 4, the
# decoder's per-head q/k RMSNorm weights qk_gain * (1 + 0.2 N(0, 1)) as in tiny (sharp attention),
# other norm weights 1 and norm biases 0.
REAL_SEED = 0
REAL_INIT_GAIN = 1.5
REAL_QK_NORM_GAIN = TINY_QK_NORM_GAIN
# Stand-in tokenizer ids at the real Qwen3 positions (a real checkpoint brings its own tokenizer).
REAL_SPECIAL_IDS: dict[str, int] = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|audio_start|>": 151669,
    "<|audio_end|>": 151670,
    "<|audio_pad|>": 151676,
    "<asr_text>": 151704,
    "<timestamp>": 151705,
}


def seeded_init_rule(skeleton: nn.Module, gain: float = REAL_INIT_GAIN, qk_gain: float = REAL_QK_NORM_GAIN):
    """The per-tensor init rule of the seeded real preset, classified by the owning module's type."""
    from ncnnport.lazy_weights import Init

    from ncnnport.lazy_weights import parameter_owners

    owners = parameter_owners(skeleton)

    def rule(name: str, shape: tuple[int, ...]) -> Init:
        mod = owners[name]
        leaf = name.rsplit(".", 1)[-1]
        module_name = name.rsplit(".", 1)[0]
        if module_name.endswith(("q_norm", "k_norm")) and leaf == "weight":
            return Init(qk_gain, 0.2 * qk_gain)
        if isinstance(mod, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding)):
            w = mod.weight
            if isinstance(mod, nn.Embedding):
                fan_in = w.shape[1]
            else:
                fan_in = 1
                for d in w.shape[1:]:
                    fan_in *= int(d)
            std = gain / float(fan_in) ** 0.5
            return Init(0.0, std if leaf == "weight" else std / 4)
        return Init(1.0 if leaf == "weight" else 0.0, 0.0)  # norms: weight 1, bias 0
    return rule


def preset_config(name: str) -> Qwen3ASRConfig:
    if name == "tiny":
        return tiny_config()
    if name == "real":
        return real_config()
    raise KeyError(f"unknown qwen3_asr preset {name!r}; known: {', '.join(PRESETS)}")


def reinit_weights_(
    model: nn.Module, std: float = TINY_INIT_STD, seed: int = TINY_SEED, qk_gain: float = TINY_QK_NORM_GAIN
) -> None:
    """Seeded re-init of every Linear/Conv/Embedding weight at ``std`` (biases at std/4), and of
    the decoder's per-head q/k RMSNorm weights at ``qk_gain * (1 + 0.2 * N(0, 1))``.

    Other norm weights stay 1 and biases 0, and non-trainable buffers (sinusoid positions, RoPE
    inv_freq) are untouched. Deterministic on any machine: the generator is local and modules
    are visited in ``named_modules`` order.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if name.endswith(("q_norm", "k_norm")) and getattr(mod, "weight", None) is not None:
                w = mod.weight
                w.copy_(qk_gain * (1.0 + 0.2 * torch.randn(w.shape, generator=gen, dtype=torch.float32)))
                continue
            if isinstance(mod, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding)):
                w = mod.weight
                w.copy_(torch.randn(w.shape, generator=gen, dtype=torch.float32) * std)
                bias = getattr(mod, "bias", None)
                if bias is not None:
                    bias.copy_(torch.randn(bias.shape, generator=gen, dtype=torch.float32) * (std / 4))


def build_tiny_model(
    seed: int = TINY_SEED, std: float = TINY_INIT_STD, qk_gain: float = TINY_QK_NORM_GAIN
) -> Qwen3ASRForConditionalGeneration:
    """The seeded tiny model in float32 eval mode (lm_head tied to the embedding, as in the real one)."""
    torch.manual_seed(seed)
    model = Qwen3ASRForConditionalGeneration(tiny_config())
    reinit_weights_(model, std=std, seed=seed, qk_gain=qk_gain)
    model.tie_weights()
    return model.float().eval()


def build_tiny_processor(save_dir: str | Path | None = None, special_ids: dict[str, int] | None = None
                         ) -> Qwen3ASRProcessor:
    """Tiny byte-level BPE (trained on the shipped corpus) + the real feature extractor; the
    special tokens sit at ``special_ids`` (default: the tiny ids right above the BPE)."""
    ids = special_ids or TINY_SPECIAL_IDS
    tokenizer = build_tiny_tokenizer(
        CORPUS_FILE.read_text(encoding="utf-8"),
        ids,
        vocab_size=TINY_BPE_VOCAB,
        named_tokens={
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "audio_token": "<|audio_pad|>",
            "audio_bos_token": "<|audio_start|>",
            "audio_eos_token": "<|audio_end|>",
        },
        non_special=TINY_NON_SPECIAL,
        chat_template=CHAT_TEMPLATE,
    )
    processor = Qwen3ASRProcessor(
        feature_extractor=Qwen3ASRFeatureExtractor(),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    if save_dir is not None:
        processor.save_pretrained(str(save_dir))
    return processor


def _cache_root() -> Path:
    return preset_cache_root()


def preset_fingerprint(name: str) -> str:
    """Hash of everything a preset folder is made from, so a stale cached folder is never reused."""
    h = hashlib.sha256()
    h.update(json.dumps(preset_config(name).to_dict(), sort_keys=True, default=str).encode())
    h.update(CORPUS_FILE.read_bytes())
    h.update(CHAT_TEMPLATE.encode())
    h.update(f"{TINY_SEED}:{TINY_INIT_STD}:{TINY_QK_NORM_GAIN}:{TINY_BPE_VOCAB}".encode())
    h.update(json.dumps(REAL_SPECIAL_IDS, sort_keys=True).encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


def write_preset_folder(name: str, folder: str | Path) -> Path:
    """Write preset ``name`` as a checkpoint folder. ``tiny`` gets its weights; ``real`` gets
    config + processor only (its weights are seeded per tensor on demand, never written)."""
    if name == "real":
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        real_config().save_pretrained(str(folder))
        build_tiny_processor(folder, special_ids=REAL_SPECIAL_IDS)
        from .checkpoint import make_tokenizer_config_portable

        make_tokenizer_config_portable(folder)
        return folder
    if name != "tiny":
        raise ValueError(f"unknown qwen3_asr preset {name!r}")
    from .checkpoint import save_checkpoint

    return save_checkpoint(build_tiny_model(), build_tiny_processor(), folder)


def preset_folder(name: str = "tiny", cache_dir: str | Path | None = None) -> Path:
    """The preset's checkpoint folder, written once into the cache (keyed by fingerprint)."""
    root = Path(cache_dir) if cache_dir is not None else _cache_root()
    folder = root / f"qwen3_asr-{name}-{preset_fingerprint(name)}"
    marker = "model.safetensors" if name == "tiny" else "config.json"  # folders appear by rename
    if not (folder / marker).is_file():
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        write_preset_folder(name, tmp)
        if folder.exists():  # another process won the race; keep its copy
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.rename(folder)
    return folder


def load(preset_or_ckpt: str | Path) -> tuple[Qwen3ASRForConditionalGeneration, Qwen3ASRProcessor]:
    """``"tiny"`` / ``"preset:tiny"`` -> the cached tiny preset folder; anything else is a folder path."""
    from .checkpoint import CheckpointError, load_checkpoint

    text = str(preset_or_ckpt)
    name = text.split(":", 1)[1] if text.startswith("preset:") else text
    if name in PRESETS and not Path(text).exists():
        if name == "real":
            raise CheckpointError("preset 'real' has no weights; pass a real checkpoint folder")
        return load_checkpoint(preset_folder(name))
    return load_checkpoint(Path(text))
