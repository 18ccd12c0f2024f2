"""Youtu-VL-4B-Instruct port: the ModelPort hooks (load, split, e2e parity, run)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ncnnport.contract import ModuleSpec, Tolerance
from ncnnport.parity.records import stage_record, token_record
from ncnnport.parity.tokens import teacher_forced_stats
from ncnnport.models.kit import KitPort, LayerStack
from ncnnport.registry import CaseRun, E2EContext, LoadedModel

MIN_TOKENS = 64
REAL_FIXTURES = ("grid_12x18", "text_only")
MIN_PATCHES = 4  # the resize rule never goes below one 32x32 block = 2x2 patches


def check_image_file(path: Path) -> None:
    """Raise a one-line ``ValueError`` naming ``path`` unless it is a file PIL fully decodes.

    PIL's decompression-bomb warning (more than ``Image.MAX_IMAGE_PIXELS`` pixels) is an error
    here: such an image would cost gigabytes before the resize rule shrinks it.
    """
    import warnings

    from PIL import Image, UnidentifiedImageError

    if not path.exists():
        raise ValueError(f"image {path}: no such file")
    if path.is_dir():
        raise ValueError(f"image {path}: is a directory, not an image file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                img.load()
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise ValueError(f"image {path}: refused as a decompression bomb ({exc})") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ValueError(f"image {path}: cannot be decoded as an image ({exc})") from None


class YoutuVLPort(KitPort):
    """A :class:`~.lazy.LazyYoutuVL`: weights are read (checkpoint, tiny/mid preset folders) or
    generated (seeded ``real`` preset) one module at a time; the whole model is built only when
    e2e parity, the torch bench or the run verb ask for it. ``layers=K`` keeps the first K LLM
    layers; the vision tower stays whole (its window/full-attention pattern is part of the port)."""

    name = "youtu-vl"
    presets = ("tiny", "mid", "real")
    policy_stages = ("vision", "visual_tokens", "text_embeds", "hidden", "last_logits")
    host_modules = ("text_embed",)  # tied_embed.EMBED_NAME: the lookup into lm_head's weights, traced
    layer_stacks = (LayerStack("text.num_hidden_layers", "LLM layers"),)

    def config_folder(self, preset: str, ckpt: Path | None) -> Path:
        from ncnnport.models.youtu_vl.presets import materialise_preset
        return Path(ckpt) if ckpt is not None else materialise_preset(preset)

    def read_config(self, folder: Path, preset: str) -> Any:
        from ncnnport.models.youtu_vl.checkpoint import read_config
        return read_config(folder)

    def seeded(self, config: Any, seed: int) -> Any:
        from ncnnport.models.youtu_vl import lazy
        return lazy.seeded(config, seed)

    def from_folder(self, folder: Path, config: Any, truncated: bool) -> Any:
        from ncnnport.models.youtu_vl import lazy
        return lazy.from_folder(folder, config, truncated=truncated)

    def config_json(self, reference: Any) -> dict[str, Any]:
        return reference.cfg.to_json()

    def assets(self, folder: Path) -> dict[str, Path]:
        names = ["config.json", "tokenizer.json"] + (["tokenizer_config.json"]
                                                     if (folder / "tokenizer_config.json").is_file() else [])
        return {n: folder / n for n in names}

    def extra(self, folder: Path, reference: Any) -> dict[str, Any]:
        from ncnnport.models.youtu_vl.tokenizer import load_tokenizer
        return {"tokenizer": load_tokenizer(folder), "folder": folder}

    # --- e2e parity ---------------------------------------------------------------------------
    def e2e_parity(self, ctx: E2EContext) -> list[dict[str, Any]]:
        from ncnnport.models.youtu_vl.fixtures import FIXTURES
        from ncnnport.models.youtu_vl.processor import load_image

        # real widths: one multi-window image and the text-only prompt (each fixture costs
        # minutes of CPU at real size); the tiny preset runs every fixture
        chosen = [f for f in FIXTURES if ctx.loaded.preset != "real" or f.name in REAL_FIXTURES]
        cases: list[tuple[str, Any, str]] = [(f.name, f.image(), f.prompt) for f in chosen]
        for path in ctx.user_inputs:
            cases.append((f"user:{Path(path).name}", load_image(path), "Describe this image."))
        min_tokens = int(ctx.policy.number("min_tokens", MIN_TOKENS, ctx.precision))
        gate = ctx.policy.token_gate(ctx.precision)
        trace_fixture = next((name for name, image, _ in cases if image is not None), None)
        records: list[dict[str, Any]] = []
        for name, image, prompt in cases:
            records += e2e_case(ctx.loaded, ctx.ncnn_modules, name, image, prompt,
                                lambda stage: _stage_tol(ctx, stage), max(min_tokens, MIN_TOKENS),
                                torch_modules=ctx.torch_modules, gate=gate,
                                trace_ctx=ctx if name == trace_fixture else None)
        return records

    def streamed_parity(self, ctx: E2EContext) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Prefill parity at full depth, one module of each side at a time (see streamed.py), on
        the first image fixture that spans several windows (or ``--input`` images)."""
        from ncnnport.models.youtu_vl.fixtures import FIXTURES
        from ncnnport.models.youtu_vl.processor import load_image
        from ncnnport.models.youtu_vl.streamed import streamed_parity

        fixtures = [f for f in FIXTURES if f.name == "grid_12x18"]
        for path in ctx.user_inputs:
            fixtures.append(_FileFixture(f"user:{Path(path).name}", load_image(path)))
        records: list[dict[str, Any]] = []
        receipts: dict[str, Any] = {}
        for fx in fixtures:
            recs, receipt = streamed_parity(
                ctx.loaded.reference, ctx.package_dir, ctx.loaded.extra["tokenizer"], fx,
                tol_for=lambda stage: _stage_tol(ctx, stage),
                layer_tol=lambda name: ctx.policy.default())
            records += recs
            receipts[fx.name] = receipt
        return records, receipts

    # --- run ------------------------------------------------------------------------------------
    def add_run_arguments(self, parser: Any) -> None:
        parser.add_argument("--image", type=Path, default=None, help="image file (omit for text-only)")
        parser.add_argument("--prompt", default="Describe this image.", help="user text")
        parser.add_argument("--max-new-tokens", type=int, default=128)
        parser.add_argument("--max-patches", type=int, default=None,
                            help="patch cap of the resize rule (default: the official HF processor's 36864)")
        parser.add_argument("--show-special", action="store_true",
                            help="print special tokens too (the tiny preset mostly emits filler ids)")

    def validate_run_args(self, args: Any) -> None:
        """``--image`` must be a decodable image file; sizes must be usable (before any load)."""
        if args.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be at least 1 (got {args.max_new_tokens})")
        if args.max_patches is not None and args.max_patches < MIN_PATCHES:
            raise ValueError(f"--max-patches must be at least {MIN_PATCHES} (one 2x2 merge block; "
                             f"got {args.max_patches})")
        if args.image is not None:
            check_image_file(Path(args.image))

    def validate_inputs(self, paths: Sequence[Path]) -> None:
        """Every ``parity --input`` file must be a decodable image (before any model is built)."""
        for path in paths:
            check_image_file(Path(path))

    def run(self, loaded: LoadedModel, modules: Mapping[str, Any], args: Any) -> int:
        return self._stream(modules, loaded.reference.cfg, loaded.extra["tokenizer"], args)

    @staticmethod
    def _stream(modules: Mapping[str, Any], cfg: Any, tok: Any, args: Any) -> int:
        """The run verb's generation, printed as it streams (same flow with or without torch)."""
        from ncnnport.models.youtu_vl.config import EOS_ID
        from ncnnport.models.youtu_vl.packaged import generate_ids
        from ncnnport.models.youtu_vl.pipeline import decode_runners

        streamer = TextStreamer(tok, skip_special=not args.show_special)
        generate_ids(modules, cfg, tok, args.prompt, args.image, args.max_new_tokens, args.max_patches,
                     on_token=lambda t: None if t == EOS_ID else streamer.put(t),
                     decode_runners=decode_runners(modules))
        streamer.end()
        return 0

    # --- the C++ runtime ------------------------------------------------------------------------
    cpp_executable = "ncnnport-youtu-vl"

    def cpp_cases(self, ctx: E2EContext, workdir: Path, max_new_tokens: int) -> list[Any]:
        from ncnnport.models.youtu_vl import cpp_cases
        return cpp_cases.cases(ctx, workdir, max_new_tokens, REAL_FIXTURES)

    def cpp_package_argv(self, package: Path, case: Any, workdir: Path) -> list[str]:
        from ncnnport.models.youtu_vl import cpp_cases
        return cpp_cases.package_argv(package, case, workdir)

    cpp_bench_sizes = (100, 1000)  # bench-cpp's default prompt lengths in tokens

    def cpp_bench_cases(self, ctx: Any, sizes: Sequence[int], new_tokens: int) -> Iterator[Any]:
        """``bench-cpp``'s workloads (models/youtu_vl/cpp_bench.py)."""
        from ncnnport.models.youtu_vl import cpp_bench
        return cpp_bench.cases(ctx, sizes, new_tokens)

    # --- the package alone ---------------------------------------------------------------------
    def runtime_description(self, loaded: LoadedModel) -> dict[str, Any]:
        from ncnnport.models.youtu_vl.describe import describe
        return describe(loaded.reference.cfg)

    def package_cases(self, loaded: LoadedModel) -> list[Any]:
        from ncnnport.models.youtu_vl.describe import package_cases
        return package_cases(loaded.reference, loaded.extra["tokenizer"])

    def run_case(self, package: Path, model_json: Mapping[str, Any], case: Any,
                 modules: Mapping[str, Any]) -> CaseRun:
        from ncnnport.models.youtu_vl import packaged
        return CaseRun(packaged.run_case(modules, packaged.packaged_config(package, model_json),
                                         packaged.packaged_tokenizer(package, model_json), case))

    def check_case(self, package: Path, model_json: Mapping[str, Any], case: Any,
                   modules: Mapping[str, Any]) -> dict[str, Any]:
        from ncnnport.models.youtu_vl import packaged
        return packaged.compare_case(self.run_case(package, model_json, case, modules).expected, case.expected)

    def run_package(self, package: Path, model_json: Mapping[str, Any], modules: Mapping[str, Any], args: Any) -> int:
        from ncnnport.models.youtu_vl import packaged
        return self._stream(modules, packaged.packaged_config(package, model_json),
                            packaged.packaged_tokenizer(package, model_json), args)


class _FileFixture:
    """A user's image as a streamed-parity fixture (same interface as fixtures.Fixture)."""

    def __init__(self, name: str, image: Any, prompt: str = "Describe this image.") -> None:
        self.name, self._image, self.prompt = name, image, prompt

    def image(self) -> Any:
        return self._image


class TextStreamer:
    """Prints decoded text as tokens arrive, holding back bytes of an incomplete UTF-8 character."""

    def __init__(self, tokenizer: Any, out: Any = None, skip_special: bool = True) -> None:
        self.tok, self.ids, self.printed = tokenizer, [], 0
        self.skip = skip_special
        self.out = out if out is not None else sys.stdout

    def put(self, token: int) -> None:
        self.ids.append(int(token))
        text = self.tok.decode(self.ids, skip_special_tokens=self.skip)
        if text.endswith("\ufffd"):
            return
        self.out.write(text[self.printed:])
        self.out.flush()
        self.printed = len(text)

    def end(self) -> None:
        text = self.tok.decode(self.ids, skip_special_tokens=self.skip)
        self.out.write(text[self.printed:] + "\n")
        self.out.flush()


def _stage_tol(ctx: E2EContext, stage: str) -> Tolerance:
    return ctx.policy.stage(stage, ctx.precision)


def e2e_case(loaded: LoadedModel, runners: Mapping[str, Any], fixture: str, image: Any, prompt: str,
             tol_for: Any, max_new_tokens: int,
             torch_modules: Mapping[str, Any] | None = None, gate: dict[str, Any] | None = None,
             trace_ctx: E2EContext | None = None) -> list[dict[str, Any]]:
    """Reference (PyTorch, transformers LLM with its own cache) vs the pipeline on ``runners``.

    Stages: tower output, merged visual tokens, last-position prefill logits, and greedy tokens
    (EOS does not stop either side, so every fixture compares ``max_new_tokens`` tokens). The
    pipeline is also run teacher-forced on the reference tokens: per-step KL, top-1/top-5 and the
    logit noise (which classifies a free-running flip as near-tie or hard failure) go into the
    token record, and ``gate`` (the precision mode's token gate) decides how tokens are judged.
    With ``torch_modules`` the same pipeline also runs on the eager wrappers: a mismatch there is
    an export-split bug, one only on ncnn is a conversion bug. With ``trace_ctx`` a call-by-call
    first-divergence trace of the teacher-forced run is added.
    """
    from ncnnport.models.youtu_vl.model import reference_generate
    from ncnnport.models.youtu_vl.pipeline import EMBED, embed_ids, generate
    from ncnnport.models.youtu_vl.processor import process_image
    from ncnnport.models.youtu_vl.prompt import encode_prompt
    from ncnnport.models.youtu_vl.tied_embed import with_tied_embedding

    vl, tok = loaded.reference, loaded.extra["tokenizer"]
    cfg = vl.cfg
    runners_in, runners = runners, with_tied_embedding(runners)
    processed = None if image is None else process_image(image, cfg.vision, cfg.processor)
    n_img = None if processed is None else processed.num_tokens
    ids = encode_prompt(tok, prompt, n_img, cfg.system_prompt)
    extra = {"prompt_tokens": int(ids.size)}
    if processed is not None:
        extra.update(grid=list(processed.grid_hw), visual_tokens=processed.num_tokens)
    ref = reference_generate(vl, ids, processed, max_new_tokens, stop_at_eos=False)
    cand = generate(runners, cfg, ids, processed, max_new_tokens, stop_at_eos=False)
    forced = generate(runners, cfg, ids, processed, len(ref.tokens), stop_at_eos=False,
                      keep_logits=True, forced=ref.tokens)
    tf = teacher_forced_stats(ref.step_logits, forced.step_logits)
    recs: list[dict[str, Any]] = []
    if processed is not None:
        recs.append(stage_record(fixture, "vision", ref.vision, cand.vision, tol_for("vision"), **extra))
        recs.append(stage_record(fixture, "visual_tokens", ref.merged, cand.merged,
                                 tol_for("visual_tokens"), **extra))
    every_id = np.concatenate([ids, np.asarray(ref.tokens, dtype=ids.dtype)])
    recs.append(stage_record(fixture, "text_embeds", vl.embed(every_id), embed_ids(runners, every_id),
                             tol_for("text_embeds"), host_lookup=EMBED not in runners_in, **extra))
    recs.append(stage_record(fixture, "last_logits", ref.first_logits[None], cand.first_logits[None],
                             tol_for("last_logits"), **extra))
    recs.append(token_record(fixture, ref.tokens, cand.tokens, ref.step_logits,
                             min_tokens=max_new_tokens, logit_noise=tf["logit_noise"],
                             teacher_forced=tf, gate=gate, **extra))
    if torch_modules:
        split = generate(torch_modules, cfg, ids, processed, max_new_tokens, stop_at_eos=False)
        recs.append(token_record(fixture, ref.tokens, split.tokens, ref.step_logits,
                                 stage="tokens_torch_split", min_tokens=max_new_tokens, **extra))
    if trace_ctx is not None:
        recs.append(trace_record(fixture, cfg, ids, processed, ref.tokens, trace_ctx))
    return recs


def trace_record(fixture: str, cfg: Any, ids: Any, processed: Any, forced: list[int],
                 ctx: E2EContext) -> dict[str, Any]:
    """First-divergence trace (parity.trace) of one generation teacher-forced on ``forced``, so
    the torch-wrapper and ncnn runs make the same module calls in the same order."""
    from ncnnport.models.youtu_vl.pipeline import generate
    from ncnnport.models.youtu_vl.tied_embed import with_tied_embedding
    from ncnnport.parity.trace import first_divergence, trace_gates

    def pipeline_run(modules: Mapping[str, Any]) -> None:
        generate(modules, cfg, ids, processed, len(forced), stop_at_eos=False, forced=forced)

    # a tied embedding is a host lookup on each side (torch weight vs lm_head.ncnn.bin rows):
    # added to both sets so the trace compares its calls like a graph's
    torch_mods, ncnn_mods = with_tied_embedding(ctx.torch_modules), with_tied_embedding(ctx.ncnn_modules)
    return first_divergence(fixture, pipeline_run, torch_mods, ncnn_mods,
                            **trace_gates(ctx.policy, ctx.precision, list(ncnn_mods)),
                            keep_dir=ctx.package_dir.parent / "trace",
                            gate=ctx.policy.trace_gate(ctx.precision))


PORT = YoutuVLPort()
