"""Real scale: the lazy SeedVR2 builds every graph from its own tensors only, seeded values do
not depend on what else is built, ``--layers K`` keeps a valid K-block model, and a checkpoint
folder is read per graph. No real-size graph is traced or converted here (CI has 2 cores)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ncnnport.lazy_weights import WeightSourceError
from ncnnport.models.seedvr2 import lazy
from ncnnport.models.seedvr2 import model as M
from ncnnport.models.seedvr2 import specs as S
from ncnnport.models.seedvr2.config import REAL, TINY
from ncnnport.models.seedvr2.port import PORT
from ncnnport.models.seedvr2.runner import IMAGE_SUFFIX, image_graph, vae_graph_names

torch.set_num_threads(1)


def _specs(model) -> dict:
    return {s.name: s for s in S.module_specs(model)}


@pytest.fixture(scope="module")
def real_l2():
    return PORT.load("real", None, layers=2)


def test_real_preset_is_lazy_and_truncated(real_l2) -> None:
    ref = real_l2.reference
    assert isinstance(ref, lazy.LazySeedVR2) and ref.config.dit.num_layers == 2
    assert real_l2.config["dit"]["vid_dim"] == 2560 and "real" in PORT.presets and PORT.supports_layers
    specs = _specs(ref)
    assert len(specs) == 5 + 5 + 3 + 2 * 2 + 1  # VAE graphs, their image twins, DiT
    # block 1 is the truncated model's last block: video-only post graph, unmodulated text
    assert [t.name for t in specs["dit_block_01_post"].inputs] == ["vid", "emb6", "attn_v"]
    assert "text normalised, not modulated" in specs["dit_block_01_pre"].notes
    assert ref.source.reads == {} and ref.materialized() == []   # declaring the split reads nothing
    fixtures, residency = PORT._fixtures(real_l2)
    assert [f.label for f in fixtures] == ["image_64x96", "video_9x64x96"] and residency == "image_64x96"


@pytest.mark.parametrize("name", ["dit_block_01_pre", "dit_block_01_post", "dit_input", "dit_output",
                                  "vae_decode_3", "vae_decode_3_image"])
def test_real_graph_build_reads_only_its_own_tensors(real_l2, name) -> None:
    ref = real_l2.reference
    root, parts = S.spec_parts(ref.config)[name]
    own = set(ref.view_names(root, parts))
    ref.source.reads.clear()
    wrapper = _specs(ref)[name].build()
    assert set(ref.source.reads) == own and all(n == 1 for n in ref.source.reads.values())
    assert ref.materialized() == []
    assert not any(t.is_meta for t in wrapper.state_dict().values())
    held = sum(t.numel() * 4 for t in wrapper.state_dict().values())
    assert held == ref.view_bytes(root, parts) == PORT.module_weight_bytes(real_l2)[name]


def test_real_seeded_tensors_do_not_depend_on_the_truncation(real_l2) -> None:
    """Block 1 of the 2-block model (its last block) holds the 32-block model's block-1 values."""
    whole = lazy.seeded(REAL, 0)
    for name in ("dit.blocks.1.mlp.vid.proj_out.weight", "dit.blocks.1.attn.norm_q.txt.weight",
                 "vae.decoder.conv_out.weight", "text.positive"):
        assert torch.equal(real_l2.reference.source.get(name), whole.source.get(name)), name


def test_real_split_reads_every_tensor_exactly_once() -> None:
    """Full real model: the graphs partition the 3.39e9 + 2.51e8 parameters (nothing read twice,
    nothing left out; block 31 is shared so its text weights are all used). Truncated to K
    blocks the only unread tensors are block K-1's text ``proj_out`` (its text output is never
    consumed)."""
    for layers in (None, 3):
        model = lazy.seeded(PORT.truncate(REAL, layers), 0)
        table = S.spec_parts(model.config)
        general = {g: p for g, p in table.items() if not g.endswith(IMAGE_SUFFIX)}
        # an image twin reads exactly its general graph's tensors (taps summed at export)
        assert {g: p for g, p in table.items() if g.endswith(IMAGE_SUFFIX)} == {
            image_graph(g): general[g] for g in vae_graph_names(model.config)}
        names = [n for root, parts in general.values() if parts for n in model.view_names(root, parts)]
        assert len(names) == len(set(names))
        unread = set(model.expected_shapes()) - set(names) - {lazy.TEXT}
        if layers is None:
            assert not unread
            total = sum(b for g, b in S.module_weight_bytes(model).items() if g in general)
            assert total == 4 * (3_391_475_776 + 250_648_227)
        else:
            assert unread == {"dit.blocks.2.attn.proj_out.txt.weight", "dit.blocks.2.attn.proj_out.txt.bias"}
    sizes = S.module_weight_bytes(lazy.seeded(REAL, 0))
    assert max(sizes, key=sizes.get) == "dit_block_00_post" and round(sizes["dit_block_00_post"] / 2**20) == 455


def test_layers_out_of_range_is_an_error() -> None:
    for k in (0, 33):
        with pytest.raises(ValueError, match="--layers"):
            PORT.load("real", None, layers=k)


# --- small widths: the whole model is cheap to materialise -------------------------------------
@pytest.fixture(scope="module")
def tiny_lazy():
    return lazy.seeded(TINY, 5)


def test_every_graph_built_alone_equals_the_graph_of_the_whole(tiny_lazy) -> None:
    """Seeded weights: each graph built from its own tensors equals the same graph built over the
    fully materialised model, tensor for tensor."""
    whole = M.SeedVR2(TINY, tiny_lazy.dit, tiny_lazy.vae, tiny_lazy.text)
    alone, full = _specs(lazy.seeded(TINY, 5)), _specs(whole)
    sizes = S.module_weight_bytes(whole)
    for name, spec in alone.items():
        a, b = spec.build().state_dict(), full[name].build().state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
        # every weight once: shared-weight blocks run both streams through one copy
        assert sum(4 * t.numel() for t in a.values()) == sizes[name], name


def test_truncated_models_keep_the_whole_models_values(tiny_lazy) -> None:
    """--layers 2 of a 4-block model: block 1 (separate weights) becomes the last block and keeps
    the whole model's video weights; the lazy seeded model and the built tiny preset agree."""
    cut = lazy.seeded(PORT.truncate(TINY, 2), 5)
    assert cut.dit.blocks[1].is_last and not tiny_lazy.dit.blocks[1].is_last
    a, b = cut.dit.blocks[1].state_dict(), tiny_lazy.dit.blocks[1].state_dict()
    assert a.keys() < b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    tiny = M.from_preset("tiny")
    t2 = M.truncate(tiny, 2)
    assert len(t2.dit.blocks) == 2 and t2.dit.blocks[1].is_last and t2.vae is tiny.vae
    assert torch.equal(t2.dit.blocks[1].mlp.vid.proj_in.weight, tiny.dit.blocks[1].mlp.vid.proj_in.weight)
    vid = torch.randn(1, 8, 8, 33)
    with torch.inference_mode():
        out = t2.dit(vid, t2.text, 1000.0)
    assert out.shape == (1, 8, 8, 16) and torch.isfinite(out).all()


def test_checkpoint_folder_is_read_per_graph_and_strictly(tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    tiny = M.from_preset("tiny")
    M.save(tiny, tmp_path / "ck")
    loaded = PORT.load("tiny", tmp_path / "ck", layers=2)
    ref = loaded.reference
    assert isinstance(ref, lazy.LazySeedVR2) and ref.config.dit.num_layers == 2
    ref.source.reads.clear()
    post = _specs(ref)["dit_block_00_post"].build()
    assert all(n.startswith("dit.blocks.0.") for n in ref.source.reads)
    assert torch.equal(post.mlp_v.proj_in.weight, tiny.dit.blocks[0].mlp.vid.proj_in.weight)
    # untruncated loads are strict: an unexpected or a missing tensor is an error naming it
    state = load_file(str(tmp_path / "ck" / "dit.safetensors"))
    save_file({**state, "blocks.0.extra": torch.zeros(2)}, str(tmp_path / "ck" / "dit.safetensors"))
    with pytest.raises(WeightSourceError, match="blocks.0.extra"):
        PORT.load("tiny", tmp_path / "ck")
    PORT.load("tiny", tmp_path / "ck", layers=2)            # truncated: other tensors are never read
    state.pop("blocks.0.mlp.vid.proj_in.weight")
    save_file(state, str(tmp_path / "ck" / "dit.safetensors"))
    with pytest.raises(WeightSourceError, match="blocks.0.mlp.vid.proj_in.weight"):
        PORT.load("tiny", tmp_path / "ck", layers=2)


def test_activation_walk_runs_one_block_at_a_time(tiny_lazy) -> None:
    from ncnnport.models.seedvr2.activations import measure
    from ncnnport.models.seedvr2.port import FIXTURES

    fx = FIXTURES[0]
    stats = measure(tiny_lazy, fx.video(), fx.seed)
    rows = {r["stage"]: r for r in stats.rows}
    assert {"vae latent", "emb (A-terms)", "block 00", "block 03", "velocity", "decoded"} <= set(rows)
    assert all(np.isfinite(v) for r in stats.rows for k, v in r.items() if k != "stage")
    assert "| block 03 |" in stats.table()


def test_bench_perf_stages_and_bytes(real_l2) -> None:
    perf = PORT.bench_perf_stages()
    assert perf == {s: ["256x256", "512x512"] for s in ("dit_block", "vae_encode", "vae_decode")}
    sizes = PORT.module_weight_bytes(real_l2)
    assert PORT.bench_bytes(real_l2, "dit_block", "256x256") == {
        "weights": sizes["dit_block_00_pre"] + sizes["dit_block_00_post"]}
    assert PORT.bench_bytes(real_l2, "vae_decode", "512x512")["weights"] == sum(
        sizes[f"vae_decode_{k}"] for k in range(4))


def test_torch_block_bench_builds_only_block_0() -> None:
    """The torch side of ``dit_block`` on a lazy model reads block 0 and the layers that make its
    inputs, never the other blocks or the VAE (at real width: 0.6 of 14.6 GB)."""
    from ncnnport.models.seedvr2.bench import torch_call

    model = lazy.seeded(TINY, 5)
    call = torch_call(model, "dit_block", "256x256")
    assert {n.split(".")[0] for n in model.source.reads} == {"dit", "text"}
    blocks = {n.split(".")[2] for n in model.source.reads if n.startswith("dit.blocks.")}
    assert blocks == {"0"} and model.materialized() == []
    a, b = call(), call()
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("stage", ["dit_block", "vae_encode", "vae_decode"])
def test_torch_device_bench_runs_the_cpu_bench_work(stage: str) -> None:
    """The device path of the torch bench (``bench --torch-device``: copied views, moved inputs,
    window plan and RoPE tables) computes what the CPU path computes; run here on the CPU."""
    from ncnnport.models.seedvr2.bench import _device_call, torch_call

    model = lazy.seeded(TINY, 5)
    ref = torch_call(model, stage, "32x32")()
    got = _device_call(model, stage, "32x32", torch.device("cpu"))()
    assert len(got) == len(ref) and all(np.array_equal(a, b) for a, b in zip(ref, got))
