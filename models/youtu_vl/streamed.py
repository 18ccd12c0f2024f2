"""Full-depth parity of a model too large for two copies in memory: one module of each side at a time.

Why: the real Youtu-VL-4B is ~19.5 GB of float32; the torch reference and the ncnn package do
not both fit in 24 GB, so the usual parity (whole reference model + every ncnn graph resident)
cannot run at full depth. Here the reference is the real model's own modules (the vision tower,
the merger, transformers' ``YoutuDecoderLayer`` one by one, the final norm and tied head), each
materialised from the lazy weight source, used, and released; each ncnn graph is opened from the
package, used, and released. Activations are handed along on both sides:

* ``local``: each ncnn graph is fed exactly the torch side's input to that stage;
* ``propagated``: the ncnn chain runs on its own outputs from the pixels on, compared stage by
  stage with the torch chain.

It is a prefill (teacher-forced) check on one image + prompt: vision, visual tokens, every LLM
layer's hidden state, the last-position logits, and the next-token argmax at the last
``rows`` prompt positions with the reference's top-2 margin. Free-running greedy decoding needs
every layer once per token and is left to the in-memory parity (``--layers K``).
Peak RSS is measured per phase (VmHWM reset before each).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ncnnport.contract import Tolerance
from ncnnport.memory import PhaseMemory
from ncnnport.parity.records import stage_record, token_record
from ncnnport.parity.streamed import Chain, ChainStage, run_chain, worst
from ncnnport.runtime.lazy_modules import LazyModules

ROWS = 16  # prompt positions whose next-token argmax is compared


def _hf_layer_inputs(vl: Any, n: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Causal additive mask ``[1,1,S,S]``, transformers' own RoPE (cos, sin) and positions."""
    positions = torch.arange(n)[None]
    dummy = torch.zeros(1, n, vl.cfg.text.hidden_size)
    cos_sin = vl.skeleton.model.rotary_emb(dummy, positions)  # buffers only: real on the skeleton
    mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
    return mask, cos_sin, positions


def _layer_graph_inputs(cfg: Any, n: int) -> list[np.ndarray]:
    """cos, sin, both masks and the masked dummy cache row of a prefill through ``llm_layer{i}``."""
    from ncnnport.models.youtu_vl.pipeline import layer_masks
    from ncnnport.runtime.rope import span

    t = cfg.text
    cos, sin = span(0, n, t.qk_rope_head_dim, t.rope_theta)
    return [cos, sin, *layer_masks(n, 1), np.zeros((1, 1, 1, t.kv_lora_rank), np.float32),
            np.zeros((1, 1, 1, t.qk_rope_head_dim), np.float32)]


@torch.inference_mode()
def streamed_parity(vl: Any, package: Any, tokenizer: Any, fixture: Any,
                    tol_for: Callable[[str], Tolerance], layer_tol: Callable[[str], Tolerance],
                    rows: int = ROWS) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Records (stage and token-agreement rows) and the per-phase memory/time of one fixture."""
    from ncnnport.models.youtu_vl.pipeline import LM_HEAD, encode_image, head_shards, layer_name
    from ncnnport.models.youtu_vl.processor import process_image
    from ncnnport.models.youtu_vl.prompt import encode_prompt, fuse
    from ncnnport.models.youtu_vl.tied_embed import RowShards, TiedEmbedding, read_head_table
    from ncnnport.models.youtu_vl.wrappers import TOWER

    cfg = vl.cfg
    mem = PhaseMemory()
    ncnn = LazyModules(package, resident=1)   # walking graphs in order holds one at a time
    image = process_image(fixture.image(), cfg.vision, cfg.processor)
    ids = encode_prompt(tokenizer, fixture.prompt, image.num_tokens, cfg.system_prompt)
    n = int(ids.size)
    extra = {"grid": list(image.grid_hw), "visual_tokens": image.num_tokens, "prompt_tokens": n,
             "streamed": True, "layers": cfg.text.num_hidden_layers}
    fx = fixture.name
    recs: list[dict[str, Any]] = []

    # --- vision: whole torch tower (1.6 GB at real size) vs ncnn segments one at a time ---------
    def torch_vision() -> tuple[np.ndarray, np.ndarray]:
        tower = vl.part(TOWER)
        feats = tower(torch.from_numpy(image.pixel_values), image.grid_hw).numpy()
        del tower
        merger = vl.part("merger")
        return feats, merger(torch.from_numpy(feats)).numpy()

    ref_vision, ref_merged = mem.run("vision_torch", torch_vision)
    cand_vision, cand_merged = mem.run("vision_ncnn", lambda: encode_image(ncnn, image, cfg))
    ncnn.release_all()
    recs.append(stage_record(fx, "vision", ref_vision, cand_vision, tol_for("vision"), **extra))
    recs.append(stage_record(fx, "visual_tokens", ref_merged, cand_merged, tol_for("visual_tokens"), **extra))

    # --- embeddings: torch table rows vs the host lookup into lm_head.ncnn.bin -----------------
    def torch_embeds() -> np.ndarray:
        table = vl.part("model.embed_tokens")
        return fuse(table(torch.from_numpy(ids)).numpy(), ids, ref_merged)

    ref_h = mem.run("embed_torch", torch_embeds)
    ncnn_dir = package / "ncnn"
    shards = head_shards(cfg)
    lookup = TiedEmbedding(RowShards([read_head_table(ncnn_dir / f"{h.name}.ncnn.param", ncnn_dir / f"{h.name}.ncnn.bin")
                                      for h in shards]), "head .ncnn.bin memmaps")
    (emb,) = lookup.run([ids.astype(np.int32)[None]])
    cand_h = fuse(emb[0], ids, cand_merged)
    recs.append(stage_record(fx, "text_embeds", ref_h, cand_h, tol_for("text_embeds"), **extra))

    # --- LLM layers: transformers' decoder layer vs llm_layer{i}, local and propagated ----------
    mask, cos_sin, positions = _hf_layer_inputs(vl, n)
    graph_in = _layer_graph_inputs(cfg, n)

    def layer_stage(i: int) -> ChainStage:
        name = layer_name(i)

        def reference(h: np.ndarray) -> np.ndarray:
            layer = vl.part(f"model.layers.{i}")
            out = layer(torch.from_numpy(h)[None], attention_mask=mask, position_ids=positions,
                        position_embeddings=cos_sin)
            return (out[0] if isinstance(out, tuple) else out)[0].numpy()

        return ChainStage(name, reference, lambda h: ncnn[name].run([h[None], *graph_in])[0][0], [name],
                          tol=tol_for("hidden"), local_tol=layer_tol(name),
                          propagated_as=f"{name}/propagated", one_phase=True)

    chain = Chain(fx, mem, ncnn, extra, recs)
    first = len(recs)
    ref_h, cand_h = run_chain(chain, [layer_stage(i) for i in range(cfg.text.num_hidden_layers)], ref_h, cand_h)
    layer_rows = recs[first:]
    worst_local = worst([r for r in layer_rows if r["stage"].endswith("/local")])
    worst_prop = worst([r for r in layer_rows if r["stage"].endswith("/propagated")])

    # --- head: last ``rows`` positions, torch first, released before ncnn opens its copy --------
    last = min(rows, n)

    def torch_head() -> np.ndarray:
        norm, head = vl.part("model.norm"), vl.part("lm_head")
        return head(norm(torch.from_numpy(ref_h[-last:]))).numpy()

    ref_logits = mem.run("head_torch", torch_head)

    def ncnn_head() -> tuple[np.ndarray, np.ndarray]:
        prop, local = [], []
        for shard in shards:  # one shard graph open at a time
            graph = ncnn[shard.name]
            prop.append(np.stack([graph.run([np.ascontiguousarray(cand_h[None, j:j + 1])])[0].reshape(-1)
                                  for j in range(n - last, n)]))
            local.append(graph.run([np.ascontiguousarray(ref_h[None, -1:])])[0].reshape(-1))
        return np.concatenate(prop, axis=-1), np.concatenate(local)

    cand_logits, local_last = mem.run("head_ncnn", ncnn_head)
    ncnn.release_all()
    recs.append(stage_record(fx, f"{LM_HEAD}/local", ref_logits[-1:], local_last[None], layer_tol(LM_HEAD), **extra))
    recs.append(stage_record(fx, "last_logits", ref_logits[-1:], cand_logits[-1:], tol_for("last_logits"), **extra))
    # teacher-forced next-token argmax at the last prompt positions; a flip reports the reference's
    # top-2 margin at that position
    recs.append(token_record(fx, ref_logits.argmax(-1).tolist(), cand_logits.argmax(-1).tolist(),
                             list(ref_logits), stage="next_token_argmax", min_tokens=last, **extra))
    summary = {"phases": mem.phases,
               "peak_rss_mb": max(p["peak_rss_mb"] for p in mem.phases.values()),
               "worst_local_layer": worst_local, "worst_propagated_layer": worst_prop,
               "ncnn_opens": ncnn.opens, "ncnn_peak_live": ncnn.peak_live}
    return recs, summary
