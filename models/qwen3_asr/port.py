"""Qwen3-ASR behind the ModelPort hooks: load, split, end-to-end parity and the run command.

Host rules follow the official qwen-asr 0.0.6 ``transcribe()``: range normalisation after
resampling, one pass up to 1200 s, 0.5 s padding only for chunks of a cut input, its output
parsing, "" joining and consecutive language merging, forced languages canonicalised and
validated (codes refused). The networks follow transformers 5.24 where the two disagree:

* audio attention windows: the official encoder applies its window (``cu_seqlens``) only under
  flash-attention; on CPU (sdpa / eager) it passes no mask, so audio over 8 s attends across
  windows. Its flash path and its vLLM backend window the attention, as transformers does, and
  the windowed form is what the published GPU inference computes; the CPU fallback is treated
  as the outlier and NOT reproduced.
* inputs under 1 s: the official encoder convolves only the valid mel frames of its single
  chunk, transformers pads the chunk to 100 frames (and so do the port's fixed-size conv graphs);
  the last post-conv positions differ. Matching it would need a conv graph per input length;
  the port follows transformers and the official distance is reported, not hidden.

``official_reference`` measures both against the official package when its venv is configured.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ncnnport.parity.local import recorded_parity
from ncnnport.parity.records import noise_relative_tolerance, stage_record, token_record
from ncnnport.parity.tokens import teacher_forced_stats
from ncnnport.models.kit import KitPort, LayerStack
from ncnnport.registry import CaseRun, E2EContext, LoadedModel
from ncnnport.runtime.recording import RecordingRunner


class Qwen3ASRPort(KitPort):
    """A :class:`~.lazy.LazyQwen3ASR`: weights are read (checkpoint) or generated (seeded ``real``
    preset) one module at a time; the full HF model is built only when e2e parity, the torch
    bench or the run verb ask for it. ``layers=K`` keeps the first K text and audio layers."""

    name = "qwen3-asr"
    presets = ("tiny", "real")
    policy_stages = ("log_mel", "audio_embeds", "logits")
    layer_stacks = (LayerStack("text_config.num_hidden_layers", "text layers", ("text_config.layer_types",)),
                    LayerStack("audio_config.encoder_layers", "audio layers"))

    def config_folder(self, preset: str, ckpt: Path | None) -> Path:
        from ncnnport.models.qwen3_asr.presets import preset_folder
        return Path(ckpt) if ckpt is not None else preset_folder(preset)

    def read_config(self, folder: Path, preset: str) -> Any:
        from ncnnport.models.qwen3_asr.checkpoint import load_config
        return load_config(folder)

    def seeded(self, config: Any, seed: int) -> Any:
        from ncnnport.models.qwen3_asr import lazy
        return lazy.seeded(config, seed)

    def from_folder(self, folder: Path, config: Any, truncated: bool) -> Any:
        from ncnnport.models.qwen3_asr import lazy
        return lazy.from_folder(folder, config, truncated=truncated)

    def config_json(self, reference: Any) -> dict[str, Any]:
        return reference.config.to_dict()

    def assets(self, folder: Path) -> dict[str, Path]:
        return {"processor": folder}

    def extra(self, folder: Path, reference: Any) -> dict[str, Any]:
        from ncnnport.models.qwen3_asr.checkpoint import load_processor
        return {"processor": load_processor(folder)}

    # --- parity ------------------------------------------------------------------------------
    def e2e_parity(self, ctx: E2EContext) -> list[dict[str, Any]]:
        import torch

        from ncnnport.models.qwen3_asr.audio import read_audio
        from ncnnport.models.qwen3_asr.fixtures import fixtures_for, synth_speechlike
        from ncnnport.models.qwen3_asr.reference import greedy_generate
        from ncnnport.models.qwen3_asr.runtime import make_pipeline, transcribe

        model = ctx.loaded.reference
        processor = ctx.loaded.extra["processor"]
        policy, prec = ctx.policy, ctx.precision
        n_tokens = int(policy.number("min_tokens", 64, prec))
        cases: list[tuple[str, np.ndarray, float | None]] = [
            (name, synth_speechlike(fx["seconds"], fx["seed"]), fx["max_seconds"])
            for name, fx in fixtures_for(ctx.loaded.preset, ctx.loaded.ckpt).items()]
        cases += [(f"input:{Path(p).name}", read_audio(p), None) for p in ctx.user_inputs]
        float64_refs = self._float64_prefill(model, processor, cases, policy, prec)  # before any graph opens

        ncnn_pipe = make_pipeline(ctx.ncnn_modules, model)
        recorders = {n: RecordingRunner(r, limit=8) for n, r in ctx.torch_modules.items()}
        torch_pipe = make_pipeline(recorders, model)

        records: list[dict[str, Any]] = []
        trace_fixture = cases[0][0]
        for fixture, wave, limit in cases:
            kw = {"max_chunk_seconds": limit} if limit else {}
            ours = transcribe(ncnn_pipe, processor, wave, max_new_tokens=n_tokens, min_new_tokens=n_tokens,
                              keep_logits=True, **kw)
            wrapped = transcribe(torch_pipe, processor, wave, max_new_tokens=n_tokens,
                                 min_new_tokens=n_tokens, **kw)
            for i, (run, wrun) in enumerate(zip(ours.chunks, wrapped.chunks)):
                label = fixture if len(ours.chunks) == 1 else f"{fixture}[{i}]"
                from ncnnport.models.qwen3_asr.prompt import build_prompt
                prompt = build_prompt(processor, run.chunk.samples)
                records.append(self._log_mel_record(label, prompt, run, processor, policy, prec))
                with torch.no_grad():
                    ref_enc = model.model.get_audio_features(
                        input_features=torch.from_numpy(prompt.input_features),
                        input_features_mask=torch.from_numpy(prompt.input_features_mask).long(),
                    ).pooler_output.float().numpy()
                records.append(stage_record(label, "audio_embeds", ref_enc, run.encoded["audio_embeds"],
                                            policy.stage("audio_embeds", prec),
                                            windows=int(np.ceil(run.encoded["conv"].shape[0] / (13 * ncnn_pipe.window_chunks)))))
                ref_ids, ref_logits = greedy_generate(model, prompt, n_tokens, min_new_tokens=n_tokens)
                records.append(self._prefill_logits_record(label, float64_refs.get((fixture, i)), prompt, ref_logits[0],
                                                           run.generation.prefill_logits, policy, prec))
                forced = ncnn_pipe.generate(run.input_ids, run.encoded["audio_embeds"], len(ref_ids),
                                            keep_logits=True, forced=ref_ids)
                tf = teacher_forced_stats(list(ref_logits), forced.step_logits)
                records.append(token_record(label, ref_ids, run.generation.tokens, list(ref_logits),
                                            min_tokens=n_tokens, logit_noise=tf["logit_noise"],
                                            teacher_forced=tf, gate=policy.token_gate(prec)))
                if fixture == trace_fixture and i == 0:
                    records.append(self._trace(label, model, run, ref_ids, ctx))
                records.append(token_record(label, ref_ids, wrun.generation.tokens, list(ref_logits),
                                            stage="tokens (torch wrappers)", min_tokens=n_tokens))
            same = ours.text == wrapped.text and ours.language == wrapped.language
            exact = policy.token_gate(prec)["mode"] == "exact"
            records.append({"fixture": fixture, "stage": "transcript", "kind": "text",
                            "chunks": len(ours.chunks), "seconds": round(len(wave) / 16000, 2),
                            "ncnn_text": ours.text[:200], "wrapper_text": wrapped.text[:200], "gated": exact,
                            "passed": same or not exact,
                            "reason": "" if same else "transcripts differ" + ("" if exact else " (not gated in "
                                                                             f"{prec}: tokens judged teacher-forced)")})
        default = policy.default(prec)
        for name, rec in recorders.items():
            spec_tols = {"*": default}
            for row in recorded_parity(name, rec.calls, ctx.ncnn_modules[name], spec_tols, default,
                                       case_prefix="recorded"):
                records.append({**row, "kind": "local"})
        return records

    @staticmethod
    def _trace(label: str, model: Any, run: Any, forced: list[int], ctx: E2EContext) -> dict[str, Any]:
        """Call-by-call first-divergence trace of one chunk, teacher-forced on the reference."""
        from ncnnport.models.qwen3_asr.runtime import make_pipeline
        from ncnnport.parity.trace import first_divergence, trace_gates

        def pipeline_run(modules):
            pipe = make_pipeline(modules, model)
            enc = pipe.encode(run.features, run.mask)
            pipe.generate(run.input_ids, enc["audio_embeds"], len(forced), forced=forced)

        return first_divergence(label, pipeline_run, ctx.torch_modules, ctx.ncnn_modules,
                                **trace_gates(ctx.policy, ctx.precision, list(ctx.ncnn_modules)),
                                keep_dir=ctx.package_dir.parent / "trace", gate=ctx.policy.trace_gate(ctx.precision))

    @staticmethod
    def _log_mel_record(label, prompt, run, processor, policy, prec) -> dict[str, Any]:
        """numpy log-mel vs HF, gated at max(policy floor, factor x HF's own float32 noise)."""
        from ncnnport.models.qwen3_asr.mel_reference import hf_float32_noise

        base = policy.stage("log_mel", prec)
        factor = float(policy.number("log_mel_noise_factor", 1.1, prec))
        noise = hf_float32_noise(prompt.input_features, prompt.input_features_mask,
                                 run.chunk.samples, processor.feature_extractor.mel_filters)
        return stage_record(label, "log_mel", prompt.input_features, run.features,
                            noise_relative_tolerance(base, noise, factor),
                            hf_float32_noise=noise, noise_factor=factor, policy_floor=base.max_abs_floor)

    @staticmethod
    def _float64_prefill(model, processor, cases, policy, prec) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]:
        """(fixture, chunk index) -> (prompt ids, first-step logits of the same model in float64),
        for the noise-relative logits gate; empty when the policy has no ``logits_noise_factor``.

        Computed before any ncnn graph is open: at full depth the float64 model (converted in
        place, 2x the fp32 weights) next to every open graph peaked at 22 GB of this 23 GB machine."""
        from ncnnport.models.qwen3_asr.chunking import MAX_ASR_INPUT_SECONDS, split_audio
        from ncnnport.models.qwen3_asr.features import SAMPLE_RATE
        from ncnnport.models.qwen3_asr.prompt import build_prompt
        from ncnnport.models.qwen3_asr.reference import prefill_logits_float64

        if float(policy.number("logits_noise_factor", 0.0, prec)) <= 0:
            return {}
        out = {}
        for fixture, wave, limit in cases:
            chunks = split_audio(np.asarray(wave, np.float32), SAMPLE_RATE, max_seconds=limit or MAX_ASR_INPUT_SECONDS)
            for i, chunk in enumerate(chunks):
                prompt = build_prompt(processor, chunk.samples)
                out[(fixture, i)] = (prompt.input_ids, prefill_logits_float64(model.full(), prompt))
        return out

    @staticmethod
    def _prefill_logits_record(label, exact, prompt, ref_logits, ours, policy, prec) -> dict[str, Any]:
        """First-step logits vs transformers fp32, gated at max(policy gate, factor x the
        reference's own fp32 error): transformers' logits against the same model in float64
        (``exact`` = (prompt ids, float64 logits) from :meth:`_float64_prefill`), measured on this
        prompt. The port's own distance to float64 is recorded next to it."""
        base = policy.stage("logits", prec)
        factor = float(policy.number("logits_noise_factor", 0.0, prec))
        if factor <= 0:
            return stage_record(label, "prefill_logits", ref_logits, ours, base)
        if exact is None or not np.array_equal(exact[0], prompt.input_ids):
            raise RuntimeError(f"{label}: the float64 reference was computed for another prompt")
        logits64 = exact[1]
        noise = float(np.abs(np.asarray(ref_logits, np.float64) - logits64).max())
        return stage_record(label, "prefill_logits", ref_logits, ours, noise_relative_tolerance(base, noise, factor),
                            hf_float32_noise=noise, noise_factor=factor, policy_floor=base.max_abs_floor,
                            ncnn_vs_float64_max_abs=float(np.abs(np.asarray(ours, np.float64) - logits64).max()))

    # --- official package ----------------------------------------------------------------------
    def official_reference(self, ctx_or_fixtures: Any, loaded: LoadedModel | None = None,
                           max_new_tokens: int | None = None) -> list[dict[str, Any]]:
        """Token distance of the port to the official qwen-asr package, per fixture.

        ``ctx_or_fixtures``: an :class:`E2EContext` (the e2e fixtures + ``--input`` files, ours =
        the ncnn pipeline, ``max_new_tokens`` = the policy's ``min_tokens``) or a mapping
        ``name -> 16 kHz waveform`` with ``loaded`` (ours = the transformers reference). The
        official package runs in the venv named by ``NCNNPORT_QWEN_ASR_OFFICIAL_PYTHON`` on the
        same weights written in the official layout; without it one skipped row says why.
        Both sides stop at EOS (no forced minimum length)."""
        import tempfile

        from ncnnport.models.qwen3_asr import official_ref
        from ncnnport.models.qwen3_asr.checkpoint import write_official_folder

        python = official_ref.official_python()
        if python is None:
            return [official_ref.skipped_row(f"{official_ref.OFFICIAL_PYTHON_ENV} not set: official qwen-asr not run")]
        if isinstance(ctx_or_fixtures, E2EContext):
            loaded = ctx_or_fixtures.loaded
            fixtures = self._fixture_waves(ctx_or_fixtures)
            n_tokens = max_new_tokens or int(ctx_or_fixtures.policy.number("min_tokens", 64, ctx_or_fixtures.precision))
            ours = self._ncnn_token_runs(ctx_or_fixtures, fixtures, n_tokens)
        else:
            if loaded is None:
                raise ValueError("official_reference(fixtures) needs the loaded model (loaded=...)")
            fixtures = dict(ctx_or_fixtures)
            n_tokens = max_new_tokens or 64
            ours = self._reference_token_runs(loaded, fixtures, n_tokens)
        model = loaded.reference.full() if hasattr(loaded.reference, "full") else loaded.reference
        with tempfile.TemporaryDirectory(prefix="qwen3asr-official-ckpt-") as tmp:
            folder = write_official_folder(model, loaded.extra["processor"], Path(tmp) / "ckpt")
            result = official_ref.run_official(python, folder, fixtures, max_new_tokens=n_tokens)
        return [official_ref.compare_fixture(name, *ours[name], result["results"][name]) for name in fixtures]

    @staticmethod
    def _fixture_waves(ctx: E2EContext) -> dict[str, np.ndarray]:
        from ncnnport.models.qwen3_asr.audio import read_audio
        from ncnnport.models.qwen3_asr.fixtures import fixtures_for, synth_speechlike

        waves = {name: synth_speechlike(fx["seconds"], fx["seed"])
                 for name, fx in fixtures_for(ctx.loaded.preset, ctx.loaded.ckpt).items() if fx["max_seconds"] is None}
        waves.update({f"input:{Path(p).name}": read_audio(p) for p in ctx.user_inputs})
        return waves

    @staticmethod
    def _ncnn_token_runs(ctx: E2EContext, fixtures, n_tokens: int) -> dict[str, tuple[list[list[int]], str, str | None]]:
        from ncnnport.models.qwen3_asr.runtime import make_pipeline, transcribe

        pipe = make_pipeline(ctx.ncnn_modules, ctx.loaded.reference)
        out = {}
        for name, wave in fixtures.items():
            t = transcribe(pipe, ctx.loaded.extra["processor"], wave, max_new_tokens=n_tokens)
            out[name] = ([list(r.generation.tokens) for r in t.chunks], t.text, t.language)
        return out

    @staticmethod
    def _reference_token_runs(loaded: LoadedModel, fixtures, n_tokens: int) -> dict[str, tuple[list[list[int]], str, str | None]]:
        from ncnnport.models.qwen3_asr.reference import transcribe

        model = loaded.reference.full() if hasattr(loaded.reference, "full") else loaded.reference
        out = {}
        for name, wave in fixtures.items():
            t = transcribe(model, loaded.extra["processor"], wave, max_new_tokens=n_tokens)
            out[name] = ([list(c.token_ids) for c in t.chunks], t.text, t.language)
        return out

    # --- the C++ runtime ------------------------------------------------------------------------
    cpp_executable = "ncnnport-qwen3-asr"

    def cpp_cases(self, ctx: E2EContext, workdir: Path, max_new_tokens: int) -> list[Any]:
        from ncnnport.models.qwen3_asr import cpp_cases
        return cpp_cases.cases(ctx, workdir, max_new_tokens)

    def cpp_package_argv(self, package: Path, case: Any, workdir: Path) -> list[str]:
        from ncnnport.models.qwen3_asr import cpp_cases
        return cpp_cases.package_argv(package, case, workdir)

    cpp_bench_sizes = (100, 1000)  # bench-cpp's default prompt lengths in tokens

    def cpp_bench_cases(self, ctx: Any, sizes: Sequence[int], new_tokens: int) -> Iterator[Any]:
        """``bench-cpp``'s workloads (models/qwen3_asr/cpp_bench.py)."""
        from ncnnport.models.qwen3_asr import cpp_bench
        return cpp_bench.cases(ctx, sizes, new_tokens)

    # --- the package alone ---------------------------------------------------------------------
    def runtime_description(self, loaded: LoadedModel) -> dict[str, Any]:
        """``model.json``: dims, ids, RoPE, prompt pieces (checked against the processor's own
        ids), generation defaults, log-mel constants, the tokenizer's path."""
        from ncnnport.models.qwen3_asr import describe, specs
        return describe.describe(loaded.reference, loaded.extra["processor"], specs.dims(loaded.reference))

    def package_cases(self, loaded: LoadedModel) -> list[Any]:
        from ncnnport.models.qwen3_asr import describe
        model = loaded.reference.full() if hasattr(loaded.reference, "full") else loaded.reference
        return describe.package_cases(model, loaded.extra["processor"])

    def run_case(self, package: Path, model_json, case, modules) -> CaseRun:
        from ncnnport.models.qwen3_asr import packaged
        return CaseRun(packaged.run_case(packaged.open_packaged(package, model_json, modules), case))

    def check_case(self, package: Path, model_json, case, modules) -> dict[str, Any]:
        from ncnnport.models.qwen3_asr import packaged
        return packaged.compare_case(self.run_case(package, model_json, case, modules).expected, case.expected)

    def run_package(self, package: Path, model_json, modules, args) -> int:
        from ncnnport.models.qwen3_asr import packaged
        from ncnnport.models.qwen3_asr.audio import read_audio

        asr = packaged.open_packaged(package, model_json, modules)
        result = packaged.transcribe(asr, read_audio(args.audio), language=args.language,
                                     max_new_tokens=args.max_new_tokens, max_chunk_seconds=args.max_chunk_seconds)
        print(f"language: {result.language or ''}")
        print(f"text: {result.text}")
        sys.stdout.flush()
        return 0

    # --- run ---------------------------------------------------------------------------------
    def add_run_arguments(self, parser) -> None:
        parser.add_argument("--audio", type=Path, required=True, help="wav/flac/ogg at any rate and channels")
        parser.add_argument("--language", default=None, help="force a language by name, e.g. English (case-insensitive; codes are refused as by the official API)")
        parser.add_argument("--max-new-tokens", type=int, default=256)
        parser.add_argument("--max-chunk-seconds", type=float, default=None,
                            help="one-pass limit before the quiet-spot cut rule (default: official 1200 s)")

    def validate_run_args(self, args: Any) -> None:
        """``--audio`` must be a decodable, non-empty audio file, ``--language`` a language the
        official API accepts (names, canonicalised; codes such as "en" are refused as it refuses
        them), sizes positive. One-line ValueError naming the file or option."""
        from ncnnport.models.qwen3_asr.audio import check_audio_file
        from ncnnport.models.qwen3_asr.chunking import normalize_forced_language

        check_audio_file(args.audio)
        normalize_forced_language(getattr(args, "language", None))
        if getattr(args, "max_new_tokens", 1) < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
        limit = getattr(args, "max_chunk_seconds", None)
        if limit is not None and limit <= 0:
            raise ValueError(f"--max-chunk-seconds must be > 0, got {limit}")

    def validate_inputs(self, paths) -> None:
        """Every ``parity --input`` file must decode to non-empty audio (see ``validate_run_args``)."""
        from ncnnport.models.qwen3_asr.audio import check_audio_file

        for path in paths:
            check_audio_file(path)

    def run(self, loaded: LoadedModel, modules, args) -> int:
        from ncnnport.models.qwen3_asr.audio import read_audio
        from ncnnport.models.qwen3_asr.runtime import make_pipeline, transcribe

        wave = read_audio(args.audio)
        kw = {"max_chunk_seconds": args.max_chunk_seconds} if args.max_chunk_seconds else {}
        pipe = make_pipeline(modules, loaded.reference)
        result = transcribe(pipe, loaded.extra["processor"], wave, language=args.language,
                            max_new_tokens=args.max_new_tokens, **kw)
        print(f"language: {result.language or ''}")  # "" for none, as the official package
        print(f"text: {result.text}")
        sys.stdout.flush()
        return 0


PORT = Qwen3ASRPort()
