"""ncnnport.tiny_tokenizer: exact special ids (with filler padding), named tokens, save/load."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from ncnnport.models.qwen3_asr.presets import CORPUS_FILE, TINY_SPECIAL_IDS, build_tiny_processor
from ncnnport.tiny_tokenizer import build_tiny_tokenizer

TEXT = CORPUS_FILE.read_text(encoding="utf-8")


def test_far_special_ids_are_exact_and_round_trip(tmp_path: Path) -> None:
    specials = {"<|begin|>": 128000, "<|end|>": 128001, "<|image|>": 128010, "<mark>": 128011}
    tok = build_tiny_tokenizer(
        TEXT,
        specials,
        vocab_size=400,
        named_tokens={"bos_token": "<|begin|>", "eos_token": "<|end|>", "image_token": "<|image|>"},
        non_special=("<mark>",),
        chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}",
        save_dir=tmp_path / "tok",
    )
    assert len(tok) == 128012  # dense ids: fillers pad the gap up to the largest special id
    for token, idx in specials.items():
        assert tok.convert_tokens_to_ids(token) == idx
    assert tok.image_token == "<|image|>" and tok.eos_token_id == 128001
    ids = tok("<|begin|>hello world 你好<mark><|image|>")["input_ids"]
    assert ids[0] == 128000 and ids[-2:] == [128011, 128010]
    assert tok.decode(ids, skip_special_tokens=True) == "hello world 你好<mark>"  # <mark> is not special
    reloaded = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert reloaded("héllo <|image|> 🙂")["input_ids"] == tok("héllo <|image|> 🙂")["input_ids"]
    assert reloaded.image_token == "<|image|>" and reloaded.chat_template == tok.chat_template


def test_collisions_are_errors() -> None:
    with pytest.raises(ValueError, match="already uses ids"):
        build_tiny_tokenizer(TEXT, {"<x>": 5}, vocab_size=400)
    with pytest.raises(ValueError, match="both want id"):
        build_tiny_tokenizer(TEXT, {"<x>": 1000, "<y>": 1000}, vocab_size=400)
    with pytest.raises(ValueError, match="not in special_ids"):
        build_tiny_tokenizer(TEXT, {"<x>": 1000}, vocab_size=400, named_tokens={"eos_token": "<z>"})


def test_preset_processor_exposes_the_audio_tokens() -> None:
    proc = build_tiny_processor()
    assert proc.audio_token == "<|audio_pad|>" and proc.audio_token_id == TINY_SPECIAL_IDS["<|audio_pad|>"]
    assert proc.audio_bos_token_id == TINY_SPECIAL_IDS["<|audio_start|>"]
    assert proc.audio_eos_token_id == TINY_SPECIAL_IDS["<|audio_end|>"]
    ids = proc.tokenizer("language English<asr_text>hi")["input_ids"]
    assert TINY_SPECIAL_IDS["<asr_text>"] in ids
    assert proc.decode(ids, skip_special_tokens=True) == "language English<asr_text>hi"
