"""The Qwen3-ASR inference loop over module runners (ncnn or the torch wrappers alike).

Host work: mel chunking and cropping, attention windows, audio-embedding fusion at the audio
placeholder positions, RoPE tables, masks, the KV cache and greedy selection. Graph work: the
modules of ``specs.module_specs`` (one graph per layer). Nothing here knows which backend runs
the modules.

KV cache: one :class:`~ncnnport.runtime.preallocated_cache.PreallocatedKVCache` per generation,
sized for the prompt plus every new token. Prefill writes each layer's K/V; each decode step
reads the past as views of it and writes only the new token's rows, so a step costs the same
at position 1000 as at 100 apart from attention itself. Decode runners that are plain ncnn
modules are wrapped in :class:`~ncnnport.runtime.zero_copy.ZeroCopyRunner`, which hands those
views to ncnn without a copy (any other runner gets them as ordinary arrays). Under the CPU runs
of the reduced precisions the rows are rounded to fp16 on write (``RuntimeOptions.fp16_kv_cache``),
as the C++ loop stores them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ncnnport.models.qwen3_asr.names import layer_names
from ncnnport.runtime import masks, rope, sampling
from ncnnport.runtime.options import RuntimeOptions
from ncnnport.runtime.precision import fp16_kv_rows
from ncnnport.runtime.preallocated_cache import PreallocatedKVCache
from ncnnport.runtime.zero_copy import zero_copy


def post_conv_length(frames: int) -> int:
    """Length after the three (k=3, s=2, p=1) convolutions; zero stays zero."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1 if frames > 0 else 0
    return frames


@dataclass
class Generation:
    tokens: list[int]
    step_logits: list[np.ndarray] = field(default_factory=list)
    prefill_logits: np.ndarray | None = None
    stopped_by_eos: bool = False


def _fp16_cache_rows(modules: Mapping[str, Any], decode_names: Sequence[str], package_precision: str) -> bool:
    """Whether the decode layers keep K/V rows in fp16 (``runtime.precision.fp16_kv_rows`` of
    their runtime options and the package's weights): the C++ loop's rule, so the two loops
    compute the same numbers. Runners without options (torch) keep fp32 rows."""
    options = [getattr(modules[n], "options", None) for n in decode_names]
    if not options or any(not isinstance(o, RuntimeOptions) for o in options):
        return False
    flags = {fp16_kv_rows(o, package_precision) for o in options}
    if len(flags) > 1:
        raise ValueError("qwen3-asr pipeline: the decode layers' options disagree on fp16 K/V rows")
    return flags.pop()


class Qwen3ASRPipeline:
    """``modules`` maps spec names to runners with ``.run(list[np.ndarray]) -> list[np.ndarray]``."""

    def __init__(self, modules: Mapping[str, Any], dims: Mapping[str, Any], *, audio_token_id: int,
                 eos_ids: Sequence[int], n_window_infer: int, package_precision: str = "fp32") -> None:
        self.d = dict(dims)
        self.names = layer_names(self.d)
        wanted = {"audio_conv", "audio_head", "embed", "lm_head", *self.names["audio"],
                  *self.names["prefill"], *self.names["decode"]}
        missing = wanted - set(modules)
        if missing:
            raise KeyError(f"qwen3-asr pipeline: modules missing: {sorted(missing)}")
        self.m = modules
        self.decoders = [zero_copy(modules[n]) for n in self.names["decode"]]
        self.fp16_cache_rows = _fp16_cache_rows(modules, self.names["decode"], package_precision)
        self.audio_token_id = int(audio_token_id)
        self.eos_ids = {int(e) for e in eos_ids}
        self.window_chunks = n_window_infer // self.d["chunk_frames"]
        self.freqs = rope.inv_freq(self.d["head_dim"], self.d["rope_theta"])

    # --- audio -------------------------------------------------------------------------------
    def conv_features(self, features: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """Run the conv graph per chunk; returns valid rows ``[N, d]`` and per-chunk valid lengths."""
        n_mels, total = features.shape[-2], features.shape[-1]
        chunk = self.d["chunk_frames"]
        if total % chunk:
            raise ValueError(f"mel frames {total} not a multiple of the {chunk}-frame chunk")
        rows, lengths = [], []
        flat_mask = mask.reshape(-1)
        for c in range(total // chunk):
            valid = int(flat_mask[c * chunk:(c + 1) * chunk].sum())
            if valid == 0:
                continue
            mel = np.ascontiguousarray(features.reshape(n_mels, total)[:, c * chunk:(c + 1) * chunk])[None, None]
            (out,) = self.m["audio_conv"].run([mel])
            keep = post_conv_length(valid)
            rows.append(out[0, :keep])
            lengths.append(keep)
        if not rows:
            raise ValueError("audio has no valid mel frames")
        return np.concatenate(rows, axis=0), lengths

    def encode(self, features: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        """Audio embeddings ``[N, out]`` plus the conv output, windowed as HF windows attention."""
        conv, lengths = self.conv_features(features, mask)
        window = max(lengths) * self.window_chunks
        outs = []
        for start in range(0, conv.shape[0], window):
            x = np.ascontiguousarray(conv[None, start:start + window])
            for name in self.names["audio"]:
                (x,) = self.m[name].run([x])
            (emb,) = self.m["audio_head"].run([x])
            outs.append(emb[0])
        return {"conv": conv, "audio_embeds": np.concatenate(outs, axis=0)}

    # --- text --------------------------------------------------------------------------------
    def embed_prompt(self, ids: np.ndarray, audio_embeds: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int32).reshape(1, -1)
        (emb,) = self.m["embed"].run([ids])
        slots = np.flatnonzero(ids[0] == self.audio_token_id)
        if len(slots) != audio_embeds.shape[0]:
            raise ValueError(f"prompt has {len(slots)} audio placeholders but the encoder gave "
                             f"{audio_embeds.shape[0]} embeddings")
        emb = emb.copy()
        emb[0, slots] = audio_embeds
        return emb

    def _tables(self, start: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        cos, sin = rope.cos_sin(np.arange(start, start + length), self.freqs)
        return cos[None], sin[None]

    def _logits(self, hidden_last: np.ndarray) -> np.ndarray:
        (logits,) = self.m["lm_head"].run([np.ascontiguousarray(hidden_last, dtype=np.float32).reshape(1, -1)])
        return logits.reshape(-1)

    def new_cache(self, capacity: int) -> PreallocatedKVCache:
        return PreallocatedKVCache(self.d["layers"], self.d["kv_heads"], self.d["head_dim"], capacity,
                                   owner="qwen3-asr decoder", fp16_rows=self.fp16_cache_rows)

    def prefill(self, emb: np.ndarray, cache: PreallocatedKVCache) -> np.ndarray:
        """Prompt embeddings ``[1,S,H]`` through every prefill layer into an empty ``cache``;
        returns the last row's hidden state ``[1,H]``."""
        if cache.length:
            raise ValueError(f"qwen3-asr prefill: cache already holds {cache.length} positions")
        s = emb.shape[1]
        cos, sin = self._tables(0, s)
        mask = masks.causal(s)
        h = emb
        for i, name in enumerate(self.names["prefill"]):
            h, k, v = self.m[name].run([h, cos, sin, mask])
            cache.write(i, k, v)
        cache.commit(s)
        return np.ascontiguousarray(h[:, -1])

    def decode_step(self, h: np.ndarray, cache: PreallocatedKVCache, commit: bool = True) -> np.ndarray:
        """One token's hidden state ``[1,H]`` at position ``cache.length`` through every decode
        layer; each layer's new K/V row goes into ``cache`` (``commit=False``: discarded, so a
        benchmark can repeat one position)."""
        pos = cache.length
        cos, sin = self._tables(pos, 1)
        for i, layer in enumerate(self.decoders):
            past_k, past_v = cache.past(i)
            h, k, v = layer.run([h, cos, sin, past_k, past_v])
            cache.write(i, k, v)
        if commit:
            cache.commit(1)
        else:
            cache.discard()
        return h

    def embed_token(self, token: int) -> np.ndarray:
        (emb,) = self.m["embed"].run([np.array([[token]], dtype=np.int32)])
        return emb.reshape(1, -1)

    def generate(self, ids: np.ndarray, audio_embeds: np.ndarray, max_new_tokens: int,
                 keep_logits: bool = False, on_token: Callable[[int], None] | None = None,
                 forced: Sequence[int] | None = None, min_new_tokens: int = 0) -> Generation:
        """Greedy decode. ``forced`` feeds given tokens instead of the argmax (teacher forcing),
        so logits can be compared along the reference's sequence. EOS is excluded from the
        argmax for the first ``min_new_tokens`` steps, as transformers' min_new_tokens does."""
        emb = self.embed_prompt(ids, audio_embeds)
        s = emb.shape[1]
        if s + max_new_tokens > self.d["max_positions"]:
            raise ValueError(f"prompt of {s} tokens + {max_new_tokens} new tokens exceeds the model's "
                             f"max positions ({self.d['max_positions']})")
        cache = self.new_cache(s + max(max_new_tokens, 1))
        logits = self._logits(self.prefill(emb, cache))
        gen = Generation(tokens=[], prefill_logits=logits.copy())
        for step in range(max_new_tokens):
            if keep_logits:
                gen.step_logits.append(logits.copy())
            if forced is not None:
                token = int(forced[step])
            elif step < min_new_tokens:
                token = sampling.greedy(sampling.suppress(logits, self.eos_ids))
            else:
                token = sampling.greedy(logits)
            gen.tokens.append(token)
            if on_token is not None:
                on_token(token)
            if forced is None and token in self.eos_ids:
                gen.stopped_by_eos = True
                break
            if step == max_new_tokens - 1:
                break
            logits = self._logits(self.decode_step(self.embed_token(token), cache))
        return gen
