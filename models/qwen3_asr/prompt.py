"""Prompt token ids for one audio clip, built by the checkpoint's own processor.

Why: the prompt layout (system turn, <|audio_start|> + N x <|audio_pad|> + <|audio_end|>, the
assistant turn, an optional forced-language prefill "language X<asr_text>") is defined by the
chat template shipped with the checkpoint, so it is never re-typed by hand here. The runtime
needs three things from it: the ids, where the audio placeholders are (the encoder output
replaces them in order), and how many there are (which must equal the encoder output length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the packaged runtime uses audio_token_count where transformers is absent
    from transformers import Qwen3ASRProcessor

from .features import N_WINDOW


@dataclass(frozen=True)
class PromptInputs:
    """What the text side needs besides the audio embeddings.

    ``input_ids`` [S] int64; ``audio_positions`` [A] indices of the audio placeholders in order;
    ``input_features`` [1, 128, T_pad] / ``input_features_mask`` [1, T_pad] from the HF extractor.
    """

    input_ids: np.ndarray
    audio_positions: np.ndarray
    input_features: np.ndarray
    input_features_mask: np.ndarray
    language: str | None

    @property
    def num_audio_tokens(self) -> int:
        return int(self.audio_positions.shape[0])


def audio_token_count(num_frames: int, n_window: int = N_WINDOW) -> int:
    """Encoder output length for ``num_frames`` valid mel frames: 13 tokens per full 100-frame
    chunk plus three stride-2 convs (k3, p1) over the partial last chunk."""
    chunk = 2 * n_window
    full, rest = divmod(int(num_frames), chunk)
    tokens = full * 13
    if rest:
        length = rest
        for _ in range(3):
            length = (length - 1) // 2 + 1
        tokens += length
    return tokens


def build_prompt(
    processor: Qwen3ASRProcessor,
    wave16k: np.ndarray,
    language: str | None = None,
    context: str | None = None,
) -> PromptInputs:
    """Run the processor exactly as HF's transcription request does and locate the audio slots.

    ``language`` forces the language by prefilling the assistant turn; pass the canonical name
    from ``chunking.normalize_forced_language`` (the transcribe paths do; the processor itself
    would also map codes, which the official API refuses); ``context`` becomes the system text (hotwords); None leaves it empty.
    """
    batch = processor.apply_transcription_request(
        np.asarray(wave16k, dtype=np.float32), language=language, prompt=context
    )
    ids = batch["input_ids"][0].cpu().numpy().astype(np.int64)
    positions = np.flatnonzero(ids == processor.audio_token_id).astype(np.int64)
    mask = batch["input_features_mask"].cpu().numpy()
    expected = audio_token_count(int(mask.sum()))
    if positions.shape[0] != expected:
        raise RuntimeError(
            f"prompt holds {positions.shape[0]} audio placeholders but the encoder yields {expected} tokens"
        )
    if positions.size and not np.all(np.diff(positions) == 1):
        raise RuntimeError("audio placeholders are not contiguous in the prompt")
    return PromptInputs(
        input_ids=ids,
        audio_positions=positions,
        input_features=batch["input_features"].cpu().numpy().astype(np.float32),
        input_features_mask=mask.astype(np.int32),
        language=language,
    )
