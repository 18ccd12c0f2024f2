"""The shared kit of ``ncnnport bench-cpp`` (ncnnport/drivers/cpp_bench.py) for model folders.

Why here: each model's ``cpp_bench.py`` builds its workloads (prompt, Python package loop call,
torch loop) and returns run records; the driver times, compares and tabulates them. Model folders
may not import the drivers, so the records they return, the context they get and the helpers
they share (per-token timestamps, greedy torch decode, opening the package's graphs) live here,
below both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ncnnport.registry import LoadedModel


class BenchError(RuntimeError):
    """The bench cannot be run or judged (one line naming what)."""


@dataclass
class BenchContext:
    """What a port's ``cpp_bench_cases`` gets: the loaded reference, the converted package, a
    work folder for input files (removed after the bench), the thread count of every runtime,
    whether the ncnn runtimes run on Vulkan (``--vulkan``: the Python loop's graphs then open on
    the Vulkan device, as ``verify --backend vulkan`` opens them), the torch device of the
    reference column (``--torch-device``; the driver has checked that the port serves it) and the
    ``runtime.precision`` name the ncnn runtimes run (``--precision``; torch stays fp32), and
    whether their CPU weights go onto huge pages (``--huge-pages``, ``RuntimeOptions.huge_pages``)."""

    loaded: LoadedModel
    package: Path
    workdir: Path
    threads: int
    vulkan: bool = False
    torch_device: str = "cpu"
    precision: str = "fp32"
    huge_pages: bool = False


@dataclass
class DecodeRun:
    """One generation of one runtime: its ids and its decode timing."""

    runtime: str
    prompt_tokens: int
    token_ids: list[int]
    decode_s: float
    decode_steps: int
    decode_graph_s: float | None = None  # C++ only: time inside ncnn during the decode steps
    stopped_by_eos: bool = False
    # C++ only: the bytes per value its K/V cache stored (timing.kv_cache_value_bytes: 2 for fp16
    # rows, 4 for float32; None where the executable does not say)
    kv_value_bytes: int | None = None
    # C++ only: every one-row kernel call of the run by weight width and bytes per call
    # (timing.weight_streams: [{width, bytes, calls, seconds, gbps}]) and each width's prefetch
    # state at the end (timing.gemv_prefetch: {width: "on" | "off" | "undecided"})
    weight_streams: list[dict[str, Any]] | None = None
    prefetch_states: dict[str, str] | None = None
    # C++ only: the decoder layers' graphs' share of decode_graph_s (timing.decode_layers_s; None
    # where the executable does not say): the per-layer cost flatness in context is about
    decode_layers_s: float | None = None
    # C++ only: of decode_layers_s, the one-row kernels streaming the layers' weights
    # (timing.decode_layers_stream_s): the rest is attention over the cache, norms, rope
    decode_layers_stream_s: float | None = None

    @property
    def per_token_ms(self) -> float:
        """Decode milliseconds per step (a step = one token through the layers and the head)."""
        if self.decode_steps < 1:
            raise BenchError(f"{self.runtime}: no decode step ran (ask for >= 2 new tokens)")
        return 1e3 * self.decode_s / self.decode_steps

    @property
    def overhead(self) -> float | None:
        """Share of the decode time outside the graphs (C++ only)."""
        if self.decode_graph_s is None or self.decode_s <= 0:
            return None
        return (self.decode_s - self.decode_graph_s) / self.decode_s


@dataclass
class ImageRun:
    """One end-to-end restoration of one runtime: seconds, frame bytes and the seconds of each
    pipeline stage (``vae_encode``, ``dit``, ``vae_decode``; the C++ run also ``load_graphs``,
    which is never inside a stage), for the row's per-stage table."""

    runtime: str
    seconds: float
    frames: np.ndarray
    stages: dict[str, float] = field(default_factory=dict)


def timestamps_per_token() -> tuple[list[float], Callable[[int], None]]:
    """A list and an ``on_token`` callback appending ``perf_counter()`` at every new token."""
    stamps: list[float] = []
    return stamps, lambda _token: stamps.append(time.perf_counter())


def decode_from_stamps(runtime: str, prompt_tokens: int, ids: Sequence[int], stamps: Sequence[float],
                       stopped_by_eos: bool) -> DecodeRun:
    """Decode time = first token to last token; steps = tokens - 1 (what the C++ loop counts)."""
    if len(stamps) != len(ids):
        raise BenchError(f"{runtime}: {len(stamps)} token timestamps for {len(ids)} tokens")
    steps = len(ids) - 1
    return DecodeRun(runtime, prompt_tokens, [int(t) for t in ids], stamps[-1] - stamps[0] if steps else 0.0,
                     steps, stopped_by_eos=stopped_by_eos)


def ncnn_modules(ctx: BenchContext, lazy: bool = False) -> Any:
    """The package's graphs under ``ctx.threads`` and ``ctx.precision``'s ncnn flags (on the
    Vulkan device with ``ctx.vulkan``): all opened now, or (``lazy``) each on first
    use, so a text-only LLM run never loads a vision tower (a multi-GB package). Per-token
    decode never includes an open either way: every graph it runs ran in the prefill."""
    from ncnnport.runtime.lazy_modules import LazyModules, open_ncnn_modules
    from ncnnport.runtime.options import RuntimeOptions
    from ncnnport.runtime.precision import get

    options = get(ctx.precision).options(RuntimeOptions(num_threads=ctx.threads, use_vulkan=ctx.vulkan,
                                                        huge_pages=ctx.huge_pages))
    return LazyModules(ctx.package, options=options) if lazy else open_ncnn_modules(ctx.package, options=options)


def torch_greedy(step: Callable[[Any, Any], Any], prefill: Callable[[Any], Any], new_tokens: int,
                 prompt_tokens: int, config: Any) -> DecodeRun:
    """Greedy decode in torch over a fresh ``DynamicCache(config=config)``: ``prefill(cache)``
    gives the first logits row, ``step(token, cache)`` the next; no EOS stop (the ids are
    reported, not the stopping rule); timestamps per token."""
    import torch
    from transformers import DynamicCache

    stamps, on_token = timestamps_per_token()
    ids: list[int] = []
    with torch.no_grad():
        cache = DynamicCache(config=config)
        logits = prefill(cache)
        for i in range(new_tokens):
            token = int(torch.argmax(logits.reshape(-1)))
            ids.append(token)
            on_token(token)
            if i == new_tokens - 1:
                break
            logits = step(token, cache)
    return decode_from_stamps("torch", prompt_tokens, ids, stamps, False)
