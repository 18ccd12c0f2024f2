"""Qwen3-ASR's cases for ``parity --runtime cpp``: each e2e fixture (and ``--input`` file) as an
audio file for ``ncnnport-qwen3-asr``, run beforehand on the torch-free package loop
(``packaged.transcribe``) and on the torch reference (``reference.transcribe``).

Why files: the C++ executable reads audio files only, so synthesized fixtures are written as
float32 WAV at 16 kHz (read back bit-exact, peak below 1, so no resampling or range rule
touches them) and BOTH loops read the same file through their own audio readers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ncnnport.registry import CppCase, E2EContext


def fixture_files(ctx: E2EContext, workdir: Path) -> list[tuple[str, Path, float | None]]:
    """(fixture name, audio file, one-pass limit or None) for every fixture and user input."""
    import soundfile as sf

    from ncnnport.models.qwen3_asr.features import SAMPLE_RATE
    from ncnnport.models.qwen3_asr.fixtures import fixtures_for, synth_speechlike

    workdir.mkdir(parents=True, exist_ok=True)
    out: list[tuple[str, Path, float | None]] = []
    for name, fx in fixtures_for(ctx.loaded.preset, ctx.loaded.ckpt).items():
        path = workdir / f"{name}.wav"
        sf.write(str(path), synth_speechlike(fx["seconds"], fx["seed"]), SAMPLE_RATE, subtype="FLOAT")
        out.append((name, path, fx["max_seconds"]))
    out += [(f"input:{Path(p).name}", Path(p).resolve(), None) for p in ctx.user_inputs]
    return out


def executable_argv(package: Path, audio: Path, max_new_tokens: int, max_seconds: float | None) -> list[str]:
    """The executable's arguments for one input (everything but ``--json-out``)."""
    argv = ["--package", str(Path(package).resolve()), "--audio", str(audio), "--max-new-tokens", str(max_new_tokens)]
    if max_seconds is not None:
        argv += ["--max-chunk-seconds", repr(float(max_seconds))]
    return argv


def cases(ctx: E2EContext, workdir: Path, max_new_tokens: int) -> list[CppCase]:
    """Every input run on the package loop over ``ctx.ncnn_modules`` and on the torch reference."""
    from ncnnport.fsutil import read_json
    from ncnnport.models.qwen3_asr import packaged, reference
    from ncnnport.models.qwen3_asr.audio import read_audio
    from ncnnport.models.qwen3_asr.chunking import MAX_ASR_INPUT_SECONDS

    package = Path(ctx.package_dir)
    asr = packaged.open_packaged(package, read_json(package / "model.json"), ctx.ncnn_modules)
    model = ctx.loaded.reference.full() if hasattr(ctx.loaded.reference, "full") else ctx.loaded.reference
    processor = ctx.loaded.extra["processor"]
    out = []
    for name, path, limit in fixture_files(ctx, workdir):
        wave = read_audio(path)
        ours = packaged.transcribe(asr, wave, max_new_tokens=max_new_tokens, max_chunk_seconds=limit)
        ref = reference.transcribe(model, processor, wave, max_new_tokens=max_new_tokens,
                                   max_chunk_seconds=limit or MAX_ASR_INPUT_SECONDS)
        out.append(CppCase(fixture=name, argv=executable_argv(package, path, max_new_tokens, limit),
                           python_tokens=[list(map(int, t)) for t in ours.token_ids],
                           reference_tokens=[list(map(int, c.token_ids)) for c in ref.chunks],
                           reference_logits=[list(np.asarray(c.logits)) for c in ref.chunks],
                           python_text=ours.text))
    return out


def package_argv(package: Path, case: Any, workdir: Path) -> list[str]:
    """A packaged case (``cases/<name>/``: ``input.wav``, ``max_new_tokens``, ``language``) as the
    executable's arguments; its expected ids are the reference's (``cpp_package_cases`` judges)."""
    del workdir  # the executable writes only its --json-out
    argv = ["--package", str(Path(package).resolve()), "--audio", str(case.inputs["audio"]),
            "--max-new-tokens", str(int(case.args["max_new_tokens"]))]
    if case.args.get("language"):
        argv += ["--language", str(case.args["language"])]
    return argv
