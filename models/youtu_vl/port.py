"""Youtu-VL-4B-Instruct port: the ModelPort hooks (load, split, e2e parity, run)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping


from ncnnport.contract import ModuleSpec, Tolerance
from ncnnport.parity.records import stage_record, token_record
from ncnnport.registry import E2EContext, LoadedModel, ModelPort

MIN_TOKENS = 64


class YoutuVLPort(ModelPort):
    name = "youtu-vl"
    presets = ("tiny", "mid", "real")

    # --- load / split ---------------------------------------------------------------------
    def load(self, preset: str, ckpt: Path | None) -> LoadedModel:
        from ncnnport.models.youtu_vl.checkpoint import load_checkpoint
        from ncnnport.models.youtu_vl.presets import materialise_preset

        if ckpt is not None:
            folder = Path(ckpt)
        elif preset == "real":
            raise ValueError("youtu-vl: the real preset has no seeded weights; pass --ckpt <folder>")
        else:
            folder = materialise_preset(preset)
        vl, tokenizer = load_checkpoint(folder)
        assets = {"config.json": folder / "config.json", "tokenizer.json": folder / "tokenizer.json"}
        if (folder / "tokenizer_config.json").is_file():
            assets["tokenizer_config.json"] = folder / "tokenizer_config.json"
        return LoadedModel(name=self.name, preset=preset, ckpt=ckpt, config=vl.cfg.to_json(),
                           reference=vl, assets=assets,
                           extra={"tokenizer": tokenizer, "folder": folder})

    def module_specs(self, loaded: LoadedModel) -> list[ModuleSpec]:
        from ncnnport.models.youtu_vl.specs import module_specs

        return module_specs(loaded.reference)

    # --- e2e parity ---------------------------------------------------------------------------
    def e2e_parity(self, ctx: E2EContext) -> list[dict[str, Any]]:
        from PIL import Image

        from ncnnport.models.youtu_vl.fixtures import FIXTURES

        cases: list[tuple[str, Any, str]] = [(f.name, f.image(), f.prompt) for f in FIXTURES]
        for path in ctx.user_inputs:
            with Image.open(path) as img:
                cases.append((f"user:{Path(path).name}", img.convert("RGB"), "Describe this image."))
        min_tokens = int(ctx.policy.number("min_tokens", MIN_TOKENS, ctx.precision)) if ctx.policy \
            else MIN_TOKENS
        records: list[dict[str, Any]] = []
        for name, image, prompt in cases:
            records += e2e_case(ctx.loaded, ctx.ncnn_modules, name, image, prompt,
                                lambda stage: _stage_tol(ctx, stage), max(min_tokens, MIN_TOKENS),
                                torch_modules=ctx.torch_modules)
        return records

    # --- run ------------------------------------------------------------------------------------
    def add_run_arguments(self, parser: Any) -> None:
        parser.add_argument("--image", type=Path, default=None, help="image file (omit for text-only)")
        parser.add_argument("--prompt", default="Describe this image.", help="user text")
        parser.add_argument("--max-new-tokens", type=int, default=128)
        parser.add_argument("--max-patches", type=int, default=None,
                            help="patch cap of the resize rule (default: the processor's 36864)")
        parser.add_argument("--show-special", action="store_true",
                            help="print special tokens too (the tiny preset mostly emits filler ids)")

    def run(self, loaded: LoadedModel, modules: Mapping[str, Any], args: Any) -> int:
        from PIL import Image

        from ncnnport.models.youtu_vl.config import EOS_ID
        from ncnnport.models.youtu_vl.pipeline import generate
        from ncnnport.models.youtu_vl.processor import process_image
        from ncnnport.models.youtu_vl.prompt import encode_prompt

        vl, tok = loaded.reference, loaded.extra["tokenizer"]
        cfg = vl.cfg
        image = None
        if args.image is not None:
            with Image.open(args.image) as img:
                image = process_image(img, cfg.vision, cfg.processor, args.max_patches)
        ids = encode_prompt(tok, args.prompt, None if image is None else image.num_tokens,
                            cfg.system_prompt)
        streamer = TextStreamer(tok, skip_special=not args.show_special)
        generate(modules, cfg, ids, image, args.max_new_tokens, stop_at_eos=True,
                 on_token=lambda t: None if t == EOS_ID else streamer.put(t))
        streamer.end()
        return 0


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
    if ctx.policy is None:
        return Tolerance()
    return ctx.policy.stage(stage, ctx.precision)


def e2e_case(loaded: LoadedModel, runners: Mapping[str, Any], fixture: str, image: Any, prompt: str,
             tol_for: Any, max_new_tokens: int,
             torch_modules: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Reference (PyTorch, transformers LLM with its own cache) vs the pipeline on ``runners``.

    Stages: tower output, merged visual tokens, last-position prefill logits, and greedy tokens
    (EOS does not stop either side, so every fixture compares ``max_new_tokens`` tokens). With
    ``torch_modules`` the same pipeline also runs on the eager wrappers: a mismatch there is an
    export-split bug, one only on ncnn is a conversion bug.
    """
    from ncnnport.models.youtu_vl.model import reference_generate
    from ncnnport.models.youtu_vl.pipeline import generate
    from ncnnport.models.youtu_vl.processor import process_image
    from ncnnport.models.youtu_vl.prompt import encode_prompt

    vl, tok = loaded.reference, loaded.extra["tokenizer"]
    cfg = vl.cfg
    processed = None if image is None else process_image(image, cfg.vision, cfg.processor)
    n_img = None if processed is None else processed.num_tokens
    ids = encode_prompt(tok, prompt, n_img, cfg.system_prompt)
    extra = {"prompt_tokens": int(ids.size)}
    if processed is not None:
        extra.update(grid=list(processed.grid_hw), visual_tokens=processed.num_tokens)
    ref = reference_generate(vl, ids, processed, max_new_tokens, stop_at_eos=False)
    cand = generate(runners, cfg, ids, processed, max_new_tokens, stop_at_eos=False)
    recs: list[dict[str, Any]] = []
    if processed is not None:
        recs.append(stage_record(fixture, "vision", ref.vision, cand.vision, tol_for("vision"), **extra))
        recs.append(stage_record(fixture, "visual_tokens", ref.merged, cand.merged,
                                 tol_for("visual_tokens"), **extra))
    recs.append(stage_record(fixture, "last_logits", ref.first_logits[None], cand.first_logits[None],
                             tol_for("last_logits"), **extra))
    recs.append(token_record(fixture, ref.tokens, cand.tokens, ref.step_logits,
                             min_tokens=max_new_tokens, **extra))
    if torch_modules:
        split = generate(torch_modules, cfg, ids, processed, max_new_tokens, stop_at_eos=False)
        recs.append(token_record(fixture, ref.tokens, split.tokens, ref.step_logits,
                                 stage="tokens_torch_split", min_tokens=max_new_tokens, **extra))
    return recs


PORT = YoutuVLPort()
