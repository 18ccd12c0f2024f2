"""What a Youtu-VL package needs to run without torch (``model.json``) and its packaged e2e
cases with the reference's greedy token ids (transformers LLM + the torch vision tower).

The config is stored as the HF-style ``config.json`` dict the port itself reads strictly
(``YoutuVLConfig.from_json``), so the packaged runtime rebuilds exactly the reference's config;
the other fields spell out what a runtime in another language needs from it."""

from __future__ import annotations

import dataclasses
import io
import tempfile
from pathlib import Path
from typing import Any

from ncnnport.models.youtu_vl import config as C
from ncnnport.models.youtu_vl.prompt import chat_text
from ncnnport.package.cases import PackageCase

TOKENIZER_FILE = "assets/tokenizer.json"
MAX_NEW_TOKENS = 128  # the run verb's default


def describe(cfg: C.YoutuVLConfig) -> dict[str, Any]:
    """The ``model.json`` body of a Youtu-VL package."""
    t, v = cfg.text, cfg.vision
    return {
        "config": cfg.to_json(),
        "dims": {"hidden": t.hidden_size, "layers": t.num_hidden_layers, "heads": t.num_attention_heads,
                 "vocab": t.vocab_size, "kv_lora_rank": t.kv_lora_rank, "qk_rope_head_dim": t.qk_rope_head_dim,
                 "vision_hidden": v.hidden_size, "vision_layers": v.num_hidden_layers},
        "special_ids": {"bos": C.BOS_ID, "eos_ids": [C.EOS_ID], "image_pad": C.IMAGE_PAD_ID,
                        "vision_start": C.VISION_START_ID, "vision_end": C.VISION_END_ID},
        "rope": {"text_theta": t.rope_theta, "text_interleave": t.rope_interleave, "vision_theta": v.rope_theta,
                 "vision_rule": "2-D RoPE over (row, col) of the patch grid"},
        "max_positions": t.max_position_embeddings,
        "prompt": {"system_prompt": cfg.system_prompt,
                   "template_text": chat_text("{prompt}", None, "{system}"),
                   "image_piece": "<|vision_start|>{image_pad x N}<|vision_end|> before the user text"},
        "generation": {"decoding": "greedy", "max_new_tokens": MAX_NEW_TOKENS, "stop_ids": [C.EOS_ID]},
        "preprocessing": {**{k: list(x) if isinstance(x, tuple) else x
                             for k, x in dataclasses.asdict(cfg.processor).items()},
                          "patch_size": v.patch_size, "spatial_merge_size": v.spatial_merge_size,
                          "window_size": v.window_size},
        "files": {"tokenizer": TOKENIZER_FILE},
    }


# (case name, fixture name, new tokens)
CASES = (("image_one_window", "one_window", 16), ("text_only", "text_only", 16))


def _png(image: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def package_cases(vl: Any, tokenizer: Any) -> list[PackageCase]:
    """An image case and a text-only case; expected ids from ``reference_generate`` on the image
    exactly as ``run`` reads it back from the PNG."""
    from ncnnport.models.youtu_vl.fixtures import FIXTURES
    from ncnnport.models.youtu_vl.model import reference_generate
    from ncnnport.models.youtu_vl.processor import load_image, process_image
    from ncnnport.models.youtu_vl.prompt import encode_prompt

    by_name = {f.name: f for f in FIXTURES}
    out = []
    for name, fixture, n in CASES:
        fx = by_name[fixture]
        image, files, inputs, processed = fx.image(), {}, {}, None
        if image is not None:
            files["input.png"] = _png(image)
            inputs["image"] = "input.png"
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "input.png").write_bytes(files["input.png"])
                processed = process_image(load_image(Path(tmp) / "input.png"), vl.cfg.vision, vl.cfg.processor)
        ids = encode_prompt(tokenizer, fx.prompt, None if processed is None else processed.num_tokens,
                            vl.cfg.system_prompt)
        ref = reference_generate(vl, ids, processed, n, stop_at_eos=True)
        out.append(PackageCase(name, files, inputs, expected={"token_ids": [int(t) for t in ref.tokens]},
                               args={"prompt": fx.prompt, "max_new_tokens": n}))
    return out
