"""Build a tiny byte-level BPE tokenizer for seeded test presets.

Why: no tokenizer can be downloaded, yet the HF processors and chat templates of the ported models
need a real ``PreTrainedTokenizerFast`` whose special tokens sit at the ids the model config uses
(``eos_token_id``, ``audio_token_id``, ``image_token_id`` ...). This module trains a small
byte-level BPE on a given text with the ``tokenizers`` library and then places every special token
at an exact, caller-chosen id. Ids between the trained vocabulary and a special id are filled with
unreachable filler tokens, so ``len(tokenizer)`` equals the padded vocabulary size and an id such
as 128000 is exact (the embedding table of the preset must then be at least that large).

Byte-level BPE means every input string is encodable (no unknown tokens), so prompts in any
language, and any bytes a model generates, round-trip.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Collection, Mapping

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

FILLER_TEMPLATE = "<|filler_{}|>"

# Named special-token slots that PreTrainedTokenizerFast understands as keyword arguments.
_STANDARD_NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def train_byte_bpe(text: str, vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE (GPT-2 style pre-tokenizer, no special tokens) on ``text``.

    ``vocab_size`` is an upper bound: a small text runs out of merges earlier. The 256 byte
    symbols are always present so any string is encodable.
    """
    if not text or not text.strip():
        raise ValueError("training text is empty")
    if vocab_size < 256:
        raise ValueError(f"vocab_size {vocab_size} < 256: a byte-level BPE needs all 256 byte symbols")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator([line for line in text.splitlines() if line.strip()], trainer=trainer)
    return tok


def place_special_tokens(
    base: Tokenizer, special_ids: Mapping[str, int], non_special: Collection[str] = ()
) -> Tokenizer:
    """Return a tokenizer with each special token at its exact id, gaps filled with fillers.

    Every special id must be >= the trained vocabulary size (the trained ids are dense from 0).
    The tokens are written both into the BPE vocab (so the id is reserved) and into
    ``added_tokens`` (so they are matched whole in text). Tokens listed in ``non_special`` are
    added tokens that ``skip_special_tokens`` keeps (e.g. Qwen3-ASR's ``<asr_text>`` marker,
    which the output parser must still see after special tokens are stripped).
    """
    unknown = set(non_special) - set(special_ids)
    if unknown:
        raise ValueError(f"non_special tokens {sorted(unknown)} are not in special_ids")
    state = json.loads(base.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    trained = len(vocab)
    if sorted(vocab.values()) != list(range(trained)):
        raise ValueError("trained vocabulary ids are not dense from 0")
    by_id: dict[int, str] = {}
    for token, idx in special_ids.items():
        if idx < trained:
            raise ValueError(
                f"special token {token!r} wants id {idx}, but the trained vocabulary already uses ids "
                f"0..{trained - 1}; train with a smaller vocab_size or pick larger ids"
            )
        if idx in by_id:
            raise ValueError(f"special tokens {by_id[idx]!r} and {token!r} both want id {idx}")
        if token in vocab:
            raise ValueError(f"special token {token!r} collides with a trained token")
        by_id[idx] = token
    top = max(by_id, default=trained - 1)
    for idx in range(trained, top + 1):
        vocab[by_id.get(idx, FILLER_TEMPLATE.format(idx))] = idx
    state["added_tokens"] = [
        {
            "id": idx,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": token not in non_special,
        }
        for idx, token in sorted(by_id.items())
    ]
    return Tokenizer.from_str(json.dumps(state))


def build_tiny_tokenizer(
    text: str,
    special_ids: Mapping[str, int],
    *,
    vocab_size: int = 512,
    named_tokens: Mapping[str, str] | None = None,
    non_special: Collection[str] = (),
    chat_template: str | None = None,
    model_max_length: int = 32768,
    save_dir: str | Path | None = None,
) -> PreTrainedTokenizerFast:
    """Train a tiny byte-level BPE on ``text`` and wrap it as a ``PreTrainedTokenizerFast``.

    Args:
        text: training text (ship it with the preset so the tokenizer is reproducible).
        special_ids: special token string -> exact id (e.g. ``{"<|im_end|>": 300}``).
        vocab_size: upper bound on the trained (non-special) vocabulary; must stay below the
            smallest special id.
        named_tokens: attribute name -> special token string. Standard names (``eos_token``,
            ``pad_token`` ...) become the usual attributes; any other name (``audio_token``,
            ``image_token`` ...) becomes a model-specific attribute, as the HF processors expect.
            Every value must be a key of ``special_ids``.
        non_special: tokens of ``special_ids`` that are matched whole but are not special
            (kept by ``decode(..., skip_special_tokens=True)``).
        chat_template: Jinja chat template stored with the tokenizer.
        model_max_length: recorded in the tokenizer config.
        save_dir: when given, ``save_pretrained`` writes tokenizer.json + tokenizer_config.json there.

    Returns:
        The tokenizer; ``convert_tokens_to_ids(tok) == special_ids[tok]`` for every special token.
    """
    named = dict(named_tokens or {})
    for name, token in named.items():
        if token not in special_ids:
            raise ValueError(f"named token {name}={token!r} is not in special_ids")
    core = place_special_tokens(train_byte_bpe(text, vocab_size), special_ids, non_special)
    standard = {k: v for k, v in named.items() if k in _STANDARD_NAMED}
    specific = {k: v for k, v in named.items() if k not in _STANDARD_NAMED}
    kwargs: dict = dict(standard)
    if specific:
        kwargs["extra_special_tokens"] = specific
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        **kwargs,
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    for token, idx in special_ids.items():
        got = tokenizer.convert_tokens_to_ids(token)
        if got != idx:
            raise RuntimeError(f"special token {token!r} landed at id {got}, expected {idx}")
    if save_dir is not None:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(str(save_dir))
    return tokenizer
