"""Qwen3-ASR's workloads for ``ncnnport bench-cpp`` (``ModelPort.cpp_bench_cases``).

P = the whole prompt (template + audio placeholders): a synthetic speech-like float32 WAV whose
encoder output makes the prompt about P tokens (13 audio tokens per second). The C++ executable
gets the WAV; the Python package loop runs the same file through its own features, encoder and
decoder; the torch column is transformers' text decoder + head on the Python run's own prompt
embeddings, so the three runtimes decode the same prompt.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ncnnport.fsutil import read_json
from ncnnport.models.bench_kit import (BenchContext, BenchError, DecodeRun, decode_from_stamps, ncnn_modules,
                                       timestamps_per_token, torch_greedy)
from ncnnport.registry import CppBenchCase


class Qwen3AsrBench:
    """The opened package (once for every size) and one :class:`CppBenchCase` per prompt length."""

    def __init__(self, ctx: BenchContext) -> None:
        from ncnnport.models.qwen3_asr import packaged

        self.ctx = ctx
        self.asr = packaged.open_packaged(ctx.package, read_json(ctx.package / "model.json"), ncnn_modules(ctx))
        self.template = int(self.asr.prompt_ids(0, None).size)

    def samples_for(self, prompt: int) -> int:
        """The most 16 kHz samples whose prompt is <= ``prompt`` tokens (the mel hop is 160)."""
        from ncnnport.models.qwen3_asr import features
        from ncnnport.models.qwen3_asr.prompt import audio_token_count

        want = prompt - self.template
        if want < 1:
            raise BenchError(f"qwen3-asr: P={prompt} leaves no audio tokens (the template alone is {self.template})")
        lo, hi = 1, 200 * want  # frames; 13 tokens per 100 frames
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if audio_token_count(mid) <= want else (lo, mid - 1)
        return lo * features.HOP

    def case(self, prompt: int, new_tokens: int) -> CppBenchCase:
        """The WAV for ``prompt`` written under the work folder, and every runtime's call on it."""
        import soundfile

        from ncnnport.models.qwen3_asr.audio import read_audio
        from ncnnport.models.qwen3_asr.fixtures import synth_speechlike

        n = self.samples_for(prompt)
        wav = self.ctx.workdir / f"speech_P{prompt}.wav"
        soundfile.write(wav, synth_speechlike(n / 16000.0, seed=7)[:n], 16000, subtype="FLOAT")
        wave = read_audio(wav)
        argv = ["--package", str(self.ctx.package.resolve()), "--audio", str(wav), "--threads", str(self.ctx.threads),
                "--max-new-tokens", str(new_tokens), "--no-check"]
        fused: dict[str, Any] = {}

        def encoded_prompt() -> tuple[np.ndarray, np.ndarray]:
            """The Python loop's prompt ids and audio embeddings for the WAV (its features and encoder)."""
            from ncnnport.models.qwen3_asr import features as F
            from ncnnport.models.qwen3_asr.prompt import audio_token_count

            feats = F.extract_features(wave)
            ids = self.asr.prompt_ids(audio_token_count(int(feats.mask.sum())), None)
            return ids, self.asr.pipeline.encode(feats.features, feats.mask)["audio_embeds"]

        def python() -> DecodeRun:
            ids, audio_embeds = encoded_prompt()
            fused["embeds"] = self.asr.pipeline.embed_prompt(ids, audio_embeds)
            stamps, on_token = timestamps_per_token()
            gen = self.asr.pipeline.generate(ids, audio_embeds, new_tokens, on_token=on_token)
            return decode_from_stamps("python", int(ids.size), gen.tokens, stamps, gen.stopped_by_eos)

        def python_logits_at(k: int) -> np.ndarray:
            ids, audio_embeds = encoded_prompt()
            return self.asr.pipeline.generate(ids, audio_embeds, k + 1, keep_logits=True).step_logits[k]

        return CppBenchCase(f"P={prompt}", "decode", argv, python, self.torch_call(fused, new_tokens),
                            {"audio_seconds": n / 16000.0, "input": str(wav)}, python_logits_at=python_logits_at)

    def torch_call(self, fused: dict[str, Any], new_tokens: int) -> Callable[[], DecodeRun]:
        """transformers' text decoder + head on the Python loop's own prompt embeddings (its
        ncnn encoder output in the audio rows), so the three runtimes decode the same prompt."""
        import torch

        ref = self.ctx.loaded.reference  # the bench modules' own access (models/qwen3_asr/bench.py)
        lm, head = ref.model.language_model, ref.lm_head

        def run() -> DecodeRun:
            if "embeds" not in fused:
                raise BenchError("qwen3-asr torch run needs the Python run's prompt embeddings first")
            emb = torch.from_numpy(np.ascontiguousarray(fused["embeds"], dtype=np.float32))
            s = int(emb.shape[1])

            def prefill(cache: Any) -> Any:
                out = lm(inputs_embeds=emb, cache=cache, use_cache=True)
                return head(out.last_hidden_state[:, -1:])

            def step(token: int, cache: Any) -> Any:
                pos = torch.tensor([[cache.get_seq_length()]])
                out = lm(input_ids=torch.tensor([[token]]), cache=cache, position_ids=pos, use_cache=True)
                return head(out.last_hidden_state)

            return torch_greedy(step, prefill, new_tokens, s, lm.config)
        return run


def cases(ctx: BenchContext, sizes: Sequence[int], new_tokens: int) -> Iterator[CppBenchCase]:
    """One case per prompt length, the package opened once."""
    bench = Qwen3AsrBench(ctx)
    for prompt in sizes:
        yield bench.case(int(prompt), new_tokens)
