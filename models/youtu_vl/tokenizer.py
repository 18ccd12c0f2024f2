"""Tokenizer loading and the tiny preset's locally trained tokenizer.

Why a local BPE: nothing can be downloaded, yet the runtime must load a tokenizer from the
checkpoint folder exactly as for the real model. The tiny tokenizer is a byte-level BPE trained
on ``tiny_corpus.txt`` (shipped here) with the special tokens at their real ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ncnnport.models.youtu_vl.config import SPECIAL_TOKENS

CORPUS = Path(__file__).with_name("tiny_corpus.txt")


def build_tiny_tokenizer(save_dir: Path) -> Any:
    """Train the tiny tokenizer and save tokenizer.json + tokenizer_config.json into ``save_dir``."""
    from ncnnport.tiny_tokenizer import build_tiny_tokenizer as build

    return build(CORPUS.read_text(encoding="utf-8"), SPECIAL_TOKENS, vocab_size=600,
                 named_tokens={"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                               "image_token": "<|image_pad|>"},
                 save_dir=save_dir)


def load_tokenizer(folder: Path) -> Any:
    """``tokenizers.Tokenizer`` from ``folder/tokenizer.json``; checks the special ids."""
    from tokenizers import Tokenizer

    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {folder}")
    tok = Tokenizer.from_file(str(path))
    for token, idx in SPECIAL_TOKENS.items():
        got = tok.token_to_id(token)
        if got != idx:
            raise ValueError(f"{path}: special token {token!r} has id {got}, expected {idx}")
    return tok
