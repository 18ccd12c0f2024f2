"""``ncnnport bench-cpp MODEL`` (``make bench-cpp``): the shipped C++ loop against the Python ncnn
package loop and PyTorch eager on the same package, prompt and thread count.

LLMs (qwen3-asr, youtu-vl): per prompt length P, ``rounds`` rounds; each round runs the C++
executable (a fresh process: its own ``decode_s / decode_steps`` and ``decode_graph_s``), the
Python package loop (the same graphs through the ``ncnn`` wheel, a timestamp per token) and the
torch reference (transformers' eager model over the same weights with a ``DynamicCache``), the
order rotating per round (``runtime.perf_timing``'s rule), so a load change on the shared machine
hits all three alike. Per-token decode = the time from the first generated token to the last
over the steps between them (prefill, loading and the encoder are not in it). C++ and Python
token ids must be identical in every round (asserted: a mismatch fails the bench); the torch
ids are reported. The C++ loop's host overhead ``(decode_s - decode_graph_s) / decode_s`` is
judged against its target (<= 5 %).

SeedVR2: one 256x256 image end to end (resize, VAE encode, DiT, Euler, VAE decode, colour fix)
with the same noise file: the executable's own ``seconds.total - seconds.load_graphs`` (its graphs
load lazily inside the run; the Python loop's are opened before the rounds), the
Python loop's ``packaged.restore`` and the torch reference's ``restore``; C++ and Python frame
bytes compared (equal, else the level difference is printed: the two ncnn builds differ in the
last bits, see runtime/cpp/README.md).

What differs per model (prompt construction, the Python loop call, the torch loop) lives in the
small ``*Bench`` adapters below, chosen through ``ADAPTERS``; the timing, statistics, verdicts
and table are generic.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ncnnport.drivers.cpp_parity import CppRuntimeError, find_executable, frames_of, frames_sha256, run_executable
from ncnnport.fsutil import read_json
from ncnnport.runtime.perf_timing import ratio_estimate

OVERHEAD_TARGET = 0.05  # issue 13: the C++ loop's host time <= 5 % of its decode time
RUNTIMES = ("cpp", "python", "torch")
SCHEMA = 1


class BenchError(RuntimeError):
    """The bench cannot be run or judged (one line naming what)."""


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
    """One end-to-end restoration of one runtime: seconds and frame bytes."""

    runtime: str
    seconds: float
    frames: np.ndarray


@dataclass
class BenchCase:
    """One workload: a label, the callables of every runtime for one run each."""

    label: str
    calls: dict[str, Callable[[], Any]]
    info: dict[str, Any] = field(default_factory=dict)


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


def cpp_decode_run(out: Mapping[str, Any], exe: str) -> DecodeRun:
    """The executable's JSON (one chunk) as a DecodeRun: ``timing.decode_s``, ``decode_steps``,
    ``decode_graph_s``."""
    try:
        chunks, timing = out["chunks"], out["timing"]
        if len(chunks) != 1:
            raise BenchError(f"{exe}: {len(chunks)} chunks; the bench needs one (a shorter input)")
        c = chunks[0]
        return DecodeRun("cpp", int(c["prompt_tokens"]), [int(t) for t in c["token_ids"]], float(timing["decode_s"]),
                         int(timing["decode_steps"]), float(timing["decode_graph_s"]), bool(c["stopped_by_eos"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise BenchError(f"{exe}: result lacks chunks[0].token_ids/prompt_tokens or timing.decode_s/"
                         f"decode_steps/decode_graph_s ({exc})") from None


def cpp_call(exe: Path, argv: Sequence[str], json_out: Path, parse: Callable[[dict[str, Any], str], Any]) -> Callable[[], Any]:
    """One executable run per call, its JSON parsed by ``parse``."""
    return lambda: parse(run_executable(exe, argv, json_out), exe.name)


def interleaved_runs(calls: Mapping[str, Callable[[], Any]], rounds: int,
                     progress: Callable[[str], None] = lambda _m: None) -> dict[str, list[Any]]:
    """``rounds`` rounds, each calling every runtime once; round ``r`` starts at runtime
    ``r % n`` (the rotation of ``perf_timing.interleaved_ms``). Returns each runtime's results
    in round order."""
    names = list(calls)
    out: dict[str, list[Any]] = {n: [None] * rounds for n in names}
    for r in range(rounds):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            progress(f"round {r + 1}/{rounds}: {name}")
            out[name][r] = calls[name]()
    return out


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of one runtime's per-round values."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing id (or the shorter length), None when equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def decode_row(label: str, runs: Mapping[str, list[DecodeRun]], new_tokens: int) -> dict[str, Any]:
    """One table row from every runtime's rounds: per-token ms (median, min-max), ratios vs the
    C++ loop (median of per-round ratios), the C++ overhead and its verdict, id agreement."""
    cpp, py = runs["cpp"], runs["python"]
    row: dict[str, Any] = {"case": label, "prompt_tokens": cpp[0].prompt_tokens, "new_tokens": new_tokens,
                           "rounds": len(cpp)}
    for name, rs in runs.items():
        row[name] = {"per_token_ms": spread([r.per_token_ms for r in rs]), "decode_steps": [r.decode_steps for r in rs],
                     "stopped_by_eos": [r.stopped_by_eos for r in rs], "prompt_tokens": [r.prompt_tokens for r in rs]}
        if name != "cpp":
            row[f"{name}_over_cpp"] = ratio_estimate([r.per_token_ms for r in rs],
                                                     [r.per_token_ms for r in cpp]).to_json()
    overheads = [r.overhead for r in cpp]
    row["cpp"]["overhead"] = spread([o for o in overheads if o is not None])
    row["cpp"]["decode_graph_ms_per_token"] = spread([1e3 * r.decode_graph_s / r.decode_steps for r in cpp])
    row["overhead_target"] = OVERHEAD_TARGET
    row["overhead_met"] = row["cpp"]["overhead"]["median"] <= OVERHEAD_TARGET
    mismatches = [(i, first_difference(c.token_ids, p.token_ids)) for i, (c, p) in enumerate(zip(cpp, py))]
    mismatches += [(i, "prompt") for i, (c, p) in enumerate(zip(cpp, py)) if c.prompt_tokens != p.prompt_tokens]
    row["ids_cpp_equal_python"] = all(k is None for _, k in mismatches)
    row["id_mismatches"] = [{"round": i, "first_difference": k} for i, k in mismatches if k is not None]
    row["token_ids"] = cpp[0].token_ids
    if "torch" in runs:
        row["torch_ids_equal_cpp"] = [first_difference(t.token_ids, c.token_ids) is None
                                      for t, c in zip(runs["torch"], cpp)]
    row["forced_length"] = all(r.decode_steps == new_tokens - 1 for rs in runs.values() for r in rs)
    return row


def image_row(label: str, runs: Mapping[str, list[ImageRun]]) -> dict[str, Any]:
    """One SeedVR2 row: seconds per runtime (median, min-max), ratios vs C++, frame agreement."""
    cpp, py = runs["cpp"], runs["python"]
    row: dict[str, Any] = {"case": label, "rounds": len(cpp)}
    for name, rs in runs.items():
        row[name] = {"seconds": spread([r.seconds for r in rs]), "frames_sha256": frames_sha256(rs[0].frames)}
        if name != "cpp":
            row[f"{name}_over_cpp"] = ratio_estimate([r.seconds for r in rs], [r.seconds for r in cpp]).to_json()
    diff = np.abs(cpp[0].frames.astype(np.int16) - py[0].frames.astype(np.int16)) if cpp[0].frames.shape == py[0].frames.shape else None
    row["frames_cpp_equal_python"] = diff is not None and not diff.any()
    row["frames_cpp_vs_python"] = ({"shape_differs": [list(cpp[0].frames.shape), list(py[0].frames.shape)]} if diff is None
                                   else {"max_level_difference": int(diff.max()), "differing_bytes": int((diff > 0).sum()),
                                         "total_bytes": int(diff.size)})
    row["frames_stable_across_rounds"] = all(frames_sha256(r.frames) == frames_sha256(rs[0].frames)
                                             for rs in runs.values() for r in rs)
    return row


# --- the model adapters ------------------------------------------------------------------------


@dataclass
class Context:
    """What every adapter gets: the prepared target, its package, the executable, a work folder."""

    prep: Any
    package: Path
    exe: Path
    workdir: Path
    threads: int


def _torch_threads(threads: int) -> Callable[[], None]:
    """Set torch's intra-op threads, returning a restore callback (a bench leaves none behind)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    return lambda: torch.set_num_threads(before)


def _ncnn_modules(ctx: Context, lazy: bool = False) -> Any:
    """The package's graphs under ``ctx.threads``: all opened now, or (``lazy``) each on first
    use, so a text-only LLM run never loads the vision tower (Youtu-VL real: 6 GB package).
    Per-token decode never includes an open either way: every graph it runs ran in the prefill."""
    from ncnnport.runtime.lazy_modules import LazyModules, open_ncnn_modules
    from ncnnport.runtime.options import RuntimeOptions

    options = RuntimeOptions(num_threads=ctx.threads)
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


class Qwen3AsrBench:
    """P = the whole prompt (template + audio placeholders): a synthetic speech-like float32 WAV
    whose encoder output makes the prompt about P tokens (13 audio tokens per second)."""

    def __init__(self, ctx: Context) -> None:
        from ncnnport.models.qwen3_asr import packaged

        self.ctx = ctx
        self.asr = packaged.open_packaged(ctx.package, read_json(ctx.package / "model.json"), _ncnn_modules(ctx))
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

    def case(self, prompt: int, new_tokens: int) -> BenchCase:
        import soundfile

        from ncnnport.models.qwen3_asr.audio import read_audio
        from ncnnport.models.qwen3_asr.fixtures import synth_speechlike

        n = self.samples_for(prompt)
        wav = self.ctx.workdir / f"speech_P{prompt}.wav"
        soundfile.write(wav, synth_speechlike(n / 16000.0, seed=7)[:n], 16000, subtype="FLOAT")
        wave = read_audio(wav)
        argv = ["--package", str(self.ctx.package.resolve()), "--audio", str(wav), "--threads", str(self.ctx.threads),
                "--max-new-tokens", str(new_tokens), "--no-check"]
        fused = {}

        def python() -> DecodeRun:
            from ncnnport.models.qwen3_asr import features as F
            from ncnnport.models.qwen3_asr.prompt import audio_token_count

            feats = F.extract_features(wave)
            ids = self.asr.prompt_ids(audio_token_count(int(feats.mask.sum())), None)
            encoded = self.asr.pipeline.encode(feats.features, feats.mask)
            fused["embeds"] = self.asr.pipeline.embed_prompt(ids, encoded["audio_embeds"])
            stamps, on_token = timestamps_per_token()
            gen = self.asr.pipeline.generate(ids, encoded["audio_embeds"], new_tokens, on_token=on_token)
            return decode_from_stamps("python", int(ids.size), gen.tokens, stamps, gen.stopped_by_eos)

        calls = {"cpp": cpp_call(self.ctx.exe, argv, self.ctx.workdir / "out.json", cpp_decode_run), "python": python}
        calls["torch"] = self.torch_call(fused, new_tokens)
        return BenchCase(f"P={prompt}", calls, {"audio_seconds": n / 16000.0, "input": str(wav)})

    def torch_call(self, fused: dict[str, Any], new_tokens: int) -> Callable[[], DecodeRun]:
        """transformers' text decoder + head on the Python loop's own prompt embeddings (its
        ncnn encoder output in the audio rows), so the three runtimes decode the same prompt."""
        import torch

        ref = self.ctx.prep.loaded.reference  # the bench modules' own access (models/qwen3_asr/bench.py)
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


class YoutuVlBench:
    """P = the whole chat prompt (system + template + user text): a text prompt of repeated
    words, as many as keep the tokenized prompt <= P."""

    WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "rain",
             "falls", "on", "green", "hills", "and", "rivers", "run", "to", "sea")

    def __init__(self, ctx: Context) -> None:
        from ncnnport.models.youtu_vl import packaged

        self.ctx = ctx
        mj = read_json(ctx.package / "model.json")
        self.cfg = packaged.packaged_config(ctx.package, mj)
        self.tokenizer = packaged.packaged_tokenizer(ctx.package, mj)
        self.modules = _ncnn_modules(ctx, lazy=True)

    def prompt_ids(self, text: str) -> np.ndarray:
        from ncnnport.models.youtu_vl.prompt import encode_prompt

        return encode_prompt(self.tokenizer, text, None, self.cfg.system_prompt)

    def text_for(self, prompt: int) -> str:
        """The longest run of words whose chat prompt is <= ``prompt`` tokens."""
        words = lambda n: " ".join(self.WORDS[i % len(self.WORDS)] for i in range(n))  # noqa: E731
        lo, hi = 1, 4 * prompt
        if self.prompt_ids(words(1)).size > prompt:
            raise BenchError(f"youtu-vl: P={prompt} is shorter than the chat template")
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.prompt_ids(words(mid)).size <= prompt else (lo, mid - 1)
        return words(lo)

    def case(self, prompt: int, new_tokens: int) -> BenchCase:
        from ncnnport.models.youtu_vl import packaged

        text = self.text_for(prompt)
        ids = self.prompt_ids(text)
        argv = ["--package", str(self.ctx.package.resolve()), "--prompt", text, "--threads", str(self.ctx.threads),
                "--max-new-tokens", str(new_tokens), "--no-check"]

        def python() -> DecodeRun:
            stamps, on_token = timestamps_per_token()
            got = packaged.generate_ids(self.modules, self.cfg, self.tokenizer, text, None, new_tokens,
                                        on_token=on_token)
            eos = len(got) < new_tokens
            return decode_from_stamps("python", int(ids.size), got, stamps, eos)

        calls = {"cpp": cpp_call(self.ctx.exe, argv, self.ctx.workdir / "out.json", cpp_decode_run), "python": python,
                 "torch": self.torch_call(ids, new_tokens)}
        return BenchCase(f"P={prompt}", calls, {"prompt_text_words": len(text.split())})

    def torch_call(self, ids: np.ndarray, new_tokens: int) -> Callable[[], DecodeRun]:
        """transformers' ``YoutuForCausalLM`` eager on the same ids with a DynamicCache."""
        import torch

        llm = self.ctx.prep.loaded.reference.llm
        prompt = torch.from_numpy(ids.astype(np.int64)).reshape(1, -1)

        def run() -> DecodeRun:
            def prefill(cache: Any) -> Any:
                return llm(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1).logits

            def step(token: int, cache: Any) -> Any:
                pos = torch.tensor([[cache.get_seq_length()]])
                return llm(input_ids=torch.tensor([[token]]), cache=cache, position_ids=pos,
                           use_cache=True).logits

            return torch_greedy(step, prefill, new_tokens, int(ids.size), llm.config)
        return run


class SeedVR2Bench:
    """One synthetic HxW image (smooth gradients + seeded texture) restored at its own area,
    with noise drawn once for its latent shape and written as the executable's ``--noise``."""

    def __init__(self, ctx: Context) -> None:
        from ncnnport.models.seedvr2 import packaged
        from ncnnport.models.seedvr2.port import graph_backend_for

        self.ctx = ctx
        self.rt = packaged.open_packaged(ctx.package, read_json(ctx.package / "model.json"))
        self.backend, _ = graph_backend_for(self.rt.cfg, _ncnn_modules(ctx), trig=self.rt.trig)

    @staticmethod
    def image(height: int, width: int, seed: int = 3) -> np.ndarray:
        """uint8 (1, H, W, 3): gradients plus seeded texture (deterministic, not constant)."""
        y, x = np.mgrid[0:height, 0:width].astype(np.float32)
        rgb = np.stack([255 * x / max(width - 1, 1), 255 * y / max(height - 1, 1), 128 + 60 * np.sin((x + y) / 9)], -1)
        rgb += np.random.default_rng(seed).normal(0, 12, rgb.shape)
        return np.clip(rgb, 0, 255).astype(np.uint8)[None]

    def case(self, size: int, _new_tokens: int) -> BenchCase:
        from PIL import Image

        from ncnnport.models.seedvr2 import packaged
        from ncnnport.models.seedvr2.cpp_cases import executable_argv, write_noise
        from ncnnport.models.seedvr2.host import latent_shape_for
        from ncnnport.models.seedvr2.pipeline import Noise, restore

        video, area = self.image(size, size), size * size
        png = self.ctx.workdir / f"image_{size}.png"
        Image.fromarray(video[0]).save(png)
        noise = Noise.seeded(latent_shape_for(self.rt.cfg, video, area), 666)
        noise_file = write_noise(noise, self.ctx.workdir / f"noise_{size}.npz")
        out_dir = self.ctx.workdir / f"frames_{size}"
        argv = [*executable_argv(self.ctx.package, png, noise_file, area, out_dir), "--threads", str(self.ctx.threads),
                "--no-check"]

        def cpp_parse(out: dict[str, Any], exe: str) -> ImageRun:
            # its graphs load lazily inside `total`; the Python loop's were opened before timing
            try:
                seconds = float(out["seconds"]["total"]) - float(out["seconds"].get("load_graphs", 0.0))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise BenchError(f"{exe}: result has no seconds.total ({exc})") from None
            return ImageRun("cpp", seconds, frames_of(out, exe))

        def cpp() -> ImageRun:
            if out_dir.exists():  # the executable wants a new or empty folder
                for f in out_dir.iterdir():
                    f.unlink()
            return cpp_call(self.ctx.exe, argv, self.ctx.workdir / "out.json", cpp_parse)()

        def python() -> ImageRun:
            t = time.perf_counter()
            res = packaged.restore(self.rt, self.backend, video, noise, area)
            return ImageRun("python", time.perf_counter() - t, res.frames)

        ref = self.ctx.prep.loaded.reference
        torch_backend = self.ctx.prep.port.torch_backend(self.ctx.prep.loaded)

        def torch_run() -> ImageRun:
            t = time.perf_counter()
            res = restore(ref.config, torch_backend, video, ref.text.numpy(), noise, area=area)
            return ImageRun("torch", time.perf_counter() - t, res.frames)

        return BenchCase(f"{size}x{size}", {"cpp": cpp, "python": python, "torch": torch_run},
                         {"area": area, "noise_sha256": noise.record().get("sha256")})


ADAPTERS: dict[str, type] = {"qwen3-asr": Qwen3AsrBench, "youtu-vl": YoutuVlBench, "seedvr2": SeedVR2Bench}
IMAGE_MODELS = ("seedvr2",)


# --- the run, the table, the files -----------------------------------------------------------


def check_options(model: str, rounds: int, new_tokens: int) -> None:
    """Refuse, in one line and before anything is built, what the bench cannot run."""
    if model not in ADAPTERS:
        raise BenchError(f"bench-cpp: no C++ bench for model {model} (known: {', '.join(ADAPTERS)})")
    if rounds < 1 or new_tokens < 2:
        raise BenchError(f"bench-cpp: need --rounds >= 1 and --new-tokens >= 2 (got {rounds}, {new_tokens})")


def run_bench(prep: Any, package: Path, sizes: Sequence[int], new_tokens: int = 16, rounds: int = 3,
              threads: int = 1, torch: bool = True, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every size's rows for ``prep.target.model`` (see the module docstring); the report dict."""
    model = prep.target.model
    check_options(model, rounds, new_tokens)
    exe = find_executable(prep.port.cpp_executable)
    load_before = os.getloadavg()
    restore_threads = _torch_threads(threads)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="ncnnport-bench-cpp-") as tmp:
            adapter = ADAPTERS[model](Context(prep, Path(package), exe, Path(tmp), threads))
            for size in sizes:
                case = adapter.case(int(size), new_tokens)
                calls = case.calls if torch else {k: v for k, v in case.calls.items() if k != "torch"}
                if "torch" in calls:  # qwen3-asr's torch run reuses the Python run's prompt embeddings
                    calls = {k: calls[k] for k in ("python", "cpp", "torch")}
                runs = interleaved_runs(calls, rounds, lambda m: log(f"{model} {case.label}: {m}"))
                runs = {k: runs[k] for k in RUNTIMES if k in runs}
                row = image_row(case.label, runs) if model in IMAGE_MODELS else decode_row(case.label, runs, new_tokens)
                rows.append({**row, **case.info})
    finally:
        restore_threads()
    return {"schema": SCHEMA, "model": model, "package": str(package), "executable": str(exe),
            "preset": prep.target.preset, "layers": prep.target.layers, "threads": threads, "rounds": rounds,
            "new_tokens": None if model in IMAGE_MODELS else new_tokens, "rows": rows,
            "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
            "passed": all(r.get("ids_cpp_equal_python", True) for r in rows)}


def _ms(s: Mapping[str, float]) -> str:
    return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"


def _pct(s: Mapping[str, float]) -> str:
    return f"{100 * s['median']:.1f}% ({100 * s['min']:.1f}-{100 * s['max']:.1f})"


def _ratio(r: Mapping[str, Any] | None) -> str:
    return "-" if r is None else f"{r['median']:.2f}x [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"


def markdown(report: Mapping[str, Any], heading: str) -> str:
    """The table: the machine line, then one row per case."""
    lines = [heading, ""]
    if report["new_tokens"] is None:
        lines += ["| case | C++ s | Python ncnn s | torch eager s | Python / C++ | torch / C++ | frames C++ vs Python |",
                  "|---|---|---|---|---|---|---|"]
        for r in report["rows"]:
            d = r["frames_cpp_vs_python"]
            frames = ("byte-identical" if r["frames_cpp_equal_python"] else
                      f"{d.get('differing_bytes')} of {d.get('total_bytes')} bytes differ, max {d.get('max_level_difference')} level(s)")
            torch_s = _ms(r["torch"]["seconds"]) if "torch" in r else "-"
            lines.append(f"| {r['case']} | {_ms(r['cpp']['seconds'])} | {_ms(r['python']['seconds'])} | {torch_s} | "
                         f"{_ratio(r.get('python_over_cpp'))} | {_ratio(r.get('torch_over_cpp'))} | {frames} |")
    else:
        lines += ["| case | prompt tokens | C++ ms/token | graphs ms/token | Python ncnn ms/token | torch eager ms/token "
                  "| Python / C++ | torch / C++ | C++ overhead (target <= 5%) | ids C++ = Python |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in report["rows"]:
            torch_ms = _ms(r["torch"]["per_token_ms"]) if "torch" in r else "-"
            verdict = "met" if r["overhead_met"] else "not met"
            lines.append(f"| {r['case']} | {r['prompt_tokens']} | {_ms(r['cpp']['per_token_ms'])} | "
                         f"{_ms(r['cpp']['decode_graph_ms_per_token'])} | {_ms(r['python']['per_token_ms'])} | {torch_ms} | "
                         f"{_ratio(r.get('python_over_cpp'))} | {_ratio(r.get('torch_over_cpp'))} | "
                         f"{_pct(r['cpp']['overhead'])} {verdict} | {'yes' if r['ids_cpp_equal_python'] else 'NO'} |")
    lb, la = report["load_average"]["before"], report["load_average"]["after"]
    lines += ["", f"Medians over {report['rounds']} interleaved rounds (min-max); ratios: median of per-round ratios "
              f"[order-statistic interval]. Load average (1 min) {lb[0]:.1f} before, {la[0]:.1f} after."]
    return "\n".join(lines)


def heading(report: Mapping[str, Any]) -> str:
    """The machine line (``runtime.machine.table_heading``) plus what was run."""
    from ncnnport.drivers.torch_ratio import read_bandwidth
    from ncnnport.runtime.machine import cpu_record, table_heading

    what = (f"{report['model']} preset {report['preset']}" + (f", {report['layers']} layers" if report["layers"] else "")
            + (f", {report['new_tokens']} new tokens" if report["new_tokens"] else "") + ", fp32")
    return f"## bench-cpp: {what}\n\n" + table_heading(cpu_record(), report["threads"], read_bandwidth()["read_gbps"])


def write_report(report: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """``<model>.json`` and ``<model>.md`` under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / report["model"]
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    stem.with_suffix(".md").write_text(report["table"] + "\n", encoding="utf-8")
    return stem.with_suffix(".json"), stem.with_suffix(".md")


DEFAULT_SIZES = {"qwen3-asr": (100, 1000), "youtu-vl": (100, 1000), "seedvr2": (256,)}


def bench_target(prep: Any, package: Path, sizes: Sequence[int] | None, new_tokens: int, rounds: int,
                 threads: int, torch: bool, out_dir: Path) -> dict[str, Any]:
    """Run, print the table, write the JSON and Markdown; the report."""
    sizes = list(sizes or DEFAULT_SIZES.get(prep.target.model, ()))
    report = run_bench(prep, package, sizes, new_tokens, rounds, threads, torch)
    report["machine_heading"] = heading(report)
    report["table"] = markdown(report, report["machine_heading"])
    print("\n" + report["table"])
    paths = write_report(report, out_dir)
    print(f"report: {paths[0]}, {paths[1]}")
    return report


__all__ = ["BenchError", "CppRuntimeError", "bench_target", "run_bench", "decode_row", "image_row", "markdown"]
