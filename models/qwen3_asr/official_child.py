"""Run the official qwen-asr package on prepared fixtures; executed by the OFFICIAL venv's python.

Why a separate script: qwen-asr 0.0.6 pins transformers 4.57.6, which cannot share a process
with this project's transformers 5.24. This file imports nothing from ncnnport. It reads a job
JSON (checkpoint folder, fixtures as float32 ``.npy`` files, max_new_tokens), calls the official
``Qwen3ASRModel.transcribe`` on each fixture as a user would, records the token ids the model's
``generate`` returned for each chunk (the only instrumentation: a pass-through wrapper), and
writes a result JSON. Arrays are read with ``allow_pickle=False``.

Usage: python official_child.py JOB.json RESULT.json
"""

from __future__ import annotations

import json
import sys


def _record_generate(asr, calls: list) -> None:
    """Wrap the model's generate so the generated ids of every call are kept (outputs unchanged)."""
    original = asr.model.generate

    def generate(*args, **kwargs):
        out = original(*args, **kwargs)
        prompt_len = kwargs["input_ids"].shape[1]
        calls.append([[int(t) for t in row] for row in out.sequences[:, prompt_len:].tolist()])
        return out

    asr.model.generate = generate


def main(job_path: str, result_path: str) -> int:
    import numpy as np
    import torch
    from qwen_asr import Qwen3ASRModel

    job = json.loads(open(job_path).read())
    torch.manual_seed(0)
    asr = Qwen3ASRModel.from_pretrained(job["checkpoint"], dtype=torch.float32, device_map="cpu",
                                        attn_implementation=job.get("attn_implementation", "sdpa"),
                                        max_new_tokens=int(job["max_new_tokens"]))
    eos = asr.model.generation_config.eos_token_id
    results = {}
    for name, path in job["fixtures"].items():
        wave = np.load(path, allow_pickle=False).astype(np.float32)
        calls: list = []
        _record_generate(asr, calls)
        out = asr.transcribe(audio=(wave, 16000), language=job.get("language"))[0]
        chunks = [ids for call in calls for ids in call]
        results[name] = {"language": out.language, "text": out.text, "chunk_token_ids": chunks}
        del asr.model.generate  # back to the class method for the next fixture
    with open(result_path, "w") as f:
        json.dump({"results": results, "eos_token_id": eos}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
