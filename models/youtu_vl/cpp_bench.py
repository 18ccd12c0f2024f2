"""Youtu-VL's workloads for ``ncnnport bench-cpp`` (``ModelPort.cpp_bench_cases``).

P = the whole chat prompt (system + template + user text): a text prompt of repeated words, as
many as keep the tokenized prompt <= P. The package's graphs open lazily, so a text-only run never
loads the vision tower; the torch column is transformers' ``YoutuForCausalLM`` on the same ids.

Memory (real widths, 4 layers: the whole torch reference is 6.2 GB): each in-process runtime
holds its weights only during its own call, so the three runtimes never hold their peaks at
once (the C++ process runs beside the bench process). The Python loop releases its graphs after
every run (they reopen in the next prefill, which per-token decode does not time); the torch
call builds the lazy reference and drops it after its tokens (rebuilt, untimed, by the next
torch call); under ``--no-torch`` it is never built.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ncnnport.fsutil import read_json
from ncnnport.models.bench_kit import (BenchContext, BenchError, DecodeRun, decode_from_stamps, ncnn_modules,
                                       timestamps_per_token, torch_greedy)
from ncnnport.registry import CppBenchCase

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "rain",
         "falls", "on", "green", "hills", "and", "rivers", "run", "to", "sea")


def words(n: int) -> str:
    """The first ``n`` words of the cycled word list."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(n))


class YoutuVlBench:
    """The package's config, tokenizer and lazily opened graphs (once for every size) and one
    :class:`CppBenchCase` per prompt length."""

    def __init__(self, ctx: BenchContext) -> None:
        from ncnnport.models.youtu_vl import packaged

        self.ctx = ctx
        mj = read_json(ctx.package / "model.json")
        self.cfg = packaged.packaged_config(ctx.package, mj)
        self.tokenizer = packaged.packaged_tokenizer(ctx.package, mj)
        self.modules = ncnn_modules(ctx, lazy=True)

    def prompt_ids(self, text: str) -> np.ndarray:
        """The chat prompt's ids for the user ``text`` (no image)."""
        from ncnnport.models.youtu_vl.prompt import encode_prompt

        return encode_prompt(self.tokenizer, text, None, self.cfg.system_prompt)

    def text_for(self, prompt: int) -> str:
        """The longest run of words whose chat prompt is <= ``prompt`` tokens."""
        lo, hi = 1, 4 * prompt
        if self.prompt_ids(words(1)).size > prompt:
            raise BenchError(f"youtu-vl: P={prompt} is shorter than the chat template")
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.prompt_ids(words(mid)).size <= prompt else (lo, mid - 1)
        return words(lo)

    def case(self, prompt: int, new_tokens: int) -> CppBenchCase:
        """The text for ``prompt`` and every runtime's call on it."""
        from ncnnport.models.youtu_vl import packaged

        text = self.text_for(prompt)
        ids = self.prompt_ids(text)
        argv = ["--package", str(self.ctx.package.resolve()), "--prompt", text, "--threads", str(self.ctx.threads),
                "--max-new-tokens", str(new_tokens), "--no-check"]

        def python() -> DecodeRun:
            stamps, on_token = timestamps_per_token()
            try:
                got = packaged.generate_ids(self.modules, self.cfg, self.tokenizer, text, None, new_tokens,
                                            on_token=on_token)
            finally:
                self.modules.release_all()
            eos = len(got) < new_tokens
            return decode_from_stamps("python", int(ids.size), got, stamps, eos)

        def python_logits_at(k: int) -> np.ndarray:
            from ncnnport.models.youtu_vl.pipeline import generate

            try:
                return generate(self.modules, self.cfg, ids, None, k + 1, keep_logits=True).step_logits[k]
            finally:
                self.modules.release_all()

        return CppBenchCase(f"P={prompt}", "decode", argv, python, self.torch_call(ids, new_tokens),
                            {"prompt_text_words": len(text.split())}, python_logits_at=python_logits_at,
                            logits_stage="last_logits")

    def torch_call(self, ids: np.ndarray, new_tokens: int) -> Callable[[], DecodeRun]:
        """transformers' ``YoutuForCausalLM`` eager on the same ids with a DynamicCache. The
        reference is reached inside the call (``.llm`` builds the whole lazy model, 6.2 GB at
        real widths, 4 layers) and released after it, so neither ``--no-torch`` nor the other
        runtimes' calls hold it."""
        import torch

        prompt = torch.from_numpy(ids.astype(np.int64)).reshape(1, -1)

        def run() -> DecodeRun:
            llm = self.ctx.loaded.reference.llm

            def prefill(cache: Any) -> Any:
                return llm(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1).logits

            def step(token: int, cache: Any) -> Any:
                pos = torch.tensor([[cache.get_seq_length()]])
                return llm(input_ids=torch.tensor([[token]]), cache=cache, position_ids=pos,
                           use_cache=True).logits

            try:
                return torch_greedy(step, prefill, new_tokens, int(ids.size), llm.config)
            finally:
                self.ctx.loaded.reference.release()
        return run


def cases(ctx: BenchContext, sizes: Sequence[int], new_tokens: int) -> Iterator[CppBenchCase]:
    """One case per prompt length, the package opened once."""
    bench = YoutuVlBench(ctx)
    for prompt in sizes:
        yield bench.case(int(prompt), new_tokens)
