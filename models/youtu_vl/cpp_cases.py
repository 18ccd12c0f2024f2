"""Youtu-VL's cases for ``parity --runtime cpp``: each e2e fixture (and ``--input`` image) as an
image file plus prompt for ``ncnnport-youtu-vl``, run beforehand on the torch-free package loop
(``packaged.generate_ids``) and on the torch reference (``model.reference_generate``).

Why files: the C++ executable reads image files only, so synthesized fixture images are written
as PNG (lossless: ``load_image`` reads back the same pixels) and BOTH loops read the same file
through their own decoders and processors. Every side stops at EOS, as ``run`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Collection

from ncnnport.registry import CppCase, E2EContext

USER_PROMPT = "Describe this image."  # the prompt port.e2e_parity gives ``--input`` images


def fixture_files(ctx: E2EContext, workdir: Path, real_fixtures: Collection[str]) -> list[tuple[str, Path | None, str]]:
    """(fixture name, image file or None for text-only, prompt) for every fixture and user input;
    the real preset keeps only ``real_fixtures`` (the port's ``REAL_FIXTURES``, as e2e_parity)."""
    from ncnnport.models.youtu_vl.fixtures import FIXTURES

    workdir.mkdir(parents=True, exist_ok=True)
    out: list[tuple[str, Path | None, str]] = []
    for fx in FIXTURES:
        if ctx.loaded.preset == "real" and fx.name not in real_fixtures:
            continue
        image = fx.image()
        path = None
        if image is not None:
            path = workdir / f"{fx.name}.png"
            image.save(path, format="PNG")
        out.append((fx.name, path, fx.prompt))
    out += [(f"input:{Path(p).name}", Path(p).resolve(), USER_PROMPT) for p in ctx.user_inputs]
    return out


def executable_argv(package: Path, image: Path | None, prompt: str, max_new_tokens: int) -> list[str]:
    """The executable's arguments for one input (everything but ``--json-out``)."""
    argv = ["--package", str(Path(package).resolve()), "--prompt", prompt, "--max-new-tokens", str(max_new_tokens)]
    return argv + (["--image", str(image)] if image is not None else [])


def reference_run(vl: Any, tokenizer: Any, image: Path | None, prompt: str, max_new_tokens: int) -> Any:
    """The torch reference's greedy run on the file as the loader reads it, stopping at EOS."""
    from ncnnport.models.youtu_vl.model import reference_generate
    from ncnnport.models.youtu_vl.processor import load_image, process_image
    from ncnnport.models.youtu_vl.prompt import encode_prompt

    cfg = vl.cfg
    processed = None if image is None else process_image(load_image(image), cfg.vision, cfg.processor)
    ids = encode_prompt(tokenizer, prompt, None if processed is None else processed.num_tokens, cfg.system_prompt)
    return reference_generate(vl, ids, processed, max_new_tokens, stop_at_eos=True)


def cases(ctx: E2EContext, workdir: Path, max_new_tokens: int, real_fixtures: Collection[str]) -> list[CppCase]:
    """Every input run on the package loop over ``ctx.ncnn_modules`` and on the torch reference."""
    from ncnnport.fsutil import read_json
    from ncnnport.models.youtu_vl import packaged

    package = Path(ctx.package_dir)
    model_json = read_json(package / "model.json")
    cfg = packaged.packaged_config(package, model_json)
    tokenizer = packaged.packaged_tokenizer(package, model_json)
    vl = ctx.loaded.reference
    out = []
    for name, image, prompt in fixture_files(ctx, workdir, real_fixtures):
        ours = packaged.generate_ids(ctx.ncnn_modules, cfg, tokenizer, prompt, image, max_new_tokens)
        ref = reference_run(vl, ctx.loaded.extra["tokenizer"], image, prompt, max_new_tokens)
        out.append(CppCase(fixture=name, argv=executable_argv(package, image, prompt, max_new_tokens),
                           python_tokens=[ours], reference_tokens=[[int(t) for t in ref.tokens]],
                           reference_logits=[list(ref.step_logits)],
                           python_text=tokenizer.decode(ours, skip_special_tokens=True)))
    return out


def package_argv(package: Path, case: Any, workdir: Path) -> list[str]:
    """A packaged case (``cases/<name>/``: optional ``input.png``, ``prompt``, ``max_new_tokens``)
    as the executable's arguments; its expected ids are the reference's (``cpp_package_cases``)."""
    del workdir  # the executable writes only its --json-out
    return executable_argv(package, case.inputs.get("image"), str(case.args["prompt"]),
                           int(case.args["max_new_tokens"]))
