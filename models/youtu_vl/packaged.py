"""Youtu-VL from its package alone: graphs, ``model.json`` (the strict config) and
``tokenizer.json``; neither torch nor transformers is imported."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from ncnnport.models.youtu_vl.config import YoutuVLConfig
from ncnnport.package.model_json import PackageError


def packaged_config(package: Path, model_json: Mapping[str, Any]) -> YoutuVLConfig:
    """The reference's config, read back with the port's own strict reader."""
    path = Path(package) / "model.json"
    if not isinstance(model_json.get("config"), Mapping):
        raise PackageError(f"{path}: field 'config' missing or not an object")
    return YoutuVLConfig.from_json(model_json["config"], source=f"{path} field 'config'")


def packaged_tokenizer(package: Path, model_json: Mapping[str, Any]) -> Any:
    """The package's tokenizer, its special ids checked (``tokenizer.load_tokenizer``)."""
    from ncnnport.models.youtu_vl.tokenizer import load_tokenizer
    return load_tokenizer((Path(package) / model_json["files"]["tokenizer"]).parent)


def generate_ids(modules: Mapping[str, Any], cfg: YoutuVLConfig, tokenizer: Any, prompt: str,
                 image_path: Path | None, max_new_tokens: int, max_patches: int | None = None,
                 on_token: Callable[[int], None] | None = None,
                 decode_runners: Mapping[str, Any] | None = None) -> list[int]:
    """Greedy ids of the run verb's flow: image read and resized by the processor rule, chat
    prompt, generation stopping at EOS."""
    from ncnnport.models.youtu_vl.pipeline import generate
    from ncnnport.models.youtu_vl.processor import load_image, process_image
    from ncnnport.models.youtu_vl.prompt import encode_prompt

    image = None
    if image_path is not None:
        image = process_image(load_image(image_path), cfg.vision, cfg.processor, max_patches)
    ids = encode_prompt(tokenizer, prompt, None if image is None else image.num_tokens, cfg.system_prompt)
    gen = generate(modules, cfg, ids, image, max_new_tokens, stop_at_eos=True, on_token=on_token,
                   decode_runners=decode_runners)
    return [int(t) for t in gen.tokens]


def run_case(modules: Mapping[str, Any], cfg: YoutuVLConfig, tokenizer: Any, case: Any) -> dict[str, Any]:
    """One packaged case on the package's loop, in the schema of ``case.expected``: the ids."""
    return {"token_ids": generate_ids(modules, cfg, tokenizer, case.args["prompt"], case.inputs.get("image"),
                                      int(case.args["max_new_tokens"]))}


def compare_case(got: Mapping[str, Any], expected: Mapping[str, Any]) -> dict[str, Any]:
    """The generated ids must equal the expected ones."""
    ids, want = got["token_ids"], expected["token_ids"]
    if ids == want:
        return {"passed": True, "detail": f"{len(want)} token ids equal"}
    k = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
    return {"passed": False, "detail": f"first differing token at {k} (got {ids[k:k + 3]}, reference "
                                       f"{want[k:k + 3]}; lengths {len(ids)}/{len(want)})"}

