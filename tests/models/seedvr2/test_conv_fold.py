"""Conv folding: the VAE's 3-D convs as 2-D convs compute the same function over the same
Parameters, in torch and after pnnx -> ncnn (where they must become ``Convolution``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from ncnnport.models.seedvr2 import model as M
from ncnnport.models.seedvr2.config import TINY
from ncnnport.models.seedvr2.conv_fold import FoldedConv3d, fold_convs, folded_convs, unfold_convs
from ncnnport.models.seedvr2.vae import CausalConv3d, Downsample3D, ResnetBlock3D
from ncnnport.models.seedvr2.wrappers import VAEDecodeStage, VAEEncode

torch.set_num_threads(1)


def _close(want: torch.Tensor, got: torch.Tensor) -> None:
    assert got.shape == want.shape
    err = (want - got).abs().max().item()
    assert err <= 1e-5 * max(1.0, want.abs().max().item()), err


def _seeded(module: nn.Module, seed: int = 0) -> nn.Module:
    """Weights and biases of a visible size (default init makes 1x1 biases dominate)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module.eval()


VARIANTS = {
    "causal_333": lambda: CausalConv3d(4, 6),
    "shortcut_111": lambda: CausalConv3d(4, 6, (1, 1, 1)),
    "down_spatial_133_s122": lambda: Downsample3D(4, temporal=False),
    "down_temporal_333_s222": lambda: Downsample3D(4, temporal=True),
    "upscale_conv_111": lambda: nn.Conv3d(4, 16, 1),
}
# T=1 (the image VAE) and several frames; odd and even H/W. Stride-2 rows see H+1 after the pad.
SIZES = [(1, 7, 5), (1, 8, 6), (5, 8, 6), (4, 9, 7), (9, 6, 10)]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_folded_conv_equals_original(variant: str, size: tuple[int, int, int]) -> None:
    module = _seeded(VARIANTS[variant]())
    x = torch.randn(1, 4, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = module(x)
        module = fold_convs(module)       # a bare conv comes back as its folded replacement
        got = module(x)
    assert not any(type(m) in (nn.Conv3d, CausalConv3d) for m in module.modules())
    _close(want, got)


def test_general_causal_kernels_and_batch() -> None:
    """Beyond the VAE's shapes: 3x5x5 with padding, a padded stride-2 space-time conv, a 1x1
    conv with padding 1 (the conv yields more rows than blocks: the surplus crop), batch 2."""
    over = CausalConv3d(3, 5, (1, 1, 1))
    over.padding = (0, 1, 1)
    for conv in (CausalConv3d(3, 5, (3, 5, 5)), CausalConv3d(3, 5, (3, 3, 3), stride=(2, 2, 2)), over):
        conv = _seeded(conv)
        folded = FoldedConv3d(conv)
        for t, h, w in ((1, 7, 6), (6, 9, 8), (7, 8, 5)):
            x = torch.randn(2, 3, t, h, w)
            with torch.no_grad():
                _close(conv(x), folded(x))


def test_parameters_are_shared_not_copied() -> None:
    """Same Parameter objects under the same names; a conv under two parents is folded once."""
    block = _seeded(ResnetBlock3D(4, 8, TINY.vae))
    holder = nn.Module()
    holder.block, holder.alias = block, block.conv1          # conv1 reachable twice
    before = {k: v for k, v in holder.state_dict(keep_vars=True).items()}
    params = list(holder.parameters())
    originals = (block.conv1, block.conv2, block.conv_shortcut)
    fold_convs(holder)
    after = holder.state_dict(keep_vars=True)
    assert list(after) == list(before)
    assert all(after[k] is before[k] for k in before)
    assert [id(p) for p in holder.parameters()] == [id(p) for p in params]
    assert isinstance(block.conv1, FoldedConv3d) and holder.alias is block.conv1
    assert block.conv1.weight is originals[0].weight and block.conv1.bias is originals[0].bias
    fold_convs(holder)                                        # idempotent
    assert holder.alias is block.conv1
    unfold_convs(holder)
    assert (block.conv1, block.conv2, block.conv_shortcut) == originals and holder.alias is originals[0]
    with folded_convs(holder):
        assert isinstance(block.conv2, FoldedConv3d)
    assert block.conv2 is originals[1]


def test_copy_fold_leaves_the_original_and_shares_tensors() -> None:
    """``inplace=False``: new module shells, the same Parameter objects, original untouched."""
    ref = M.from_preset("tiny", seed=0)
    enc = ref.vae.encoder
    folded = fold_convs(enc, inplace=False)
    assert folded is not enc and isinstance(enc.conv_in, CausalConv3d)
    assert isinstance(folded.conv_in, FoldedConv3d) and folded.conv_in.weight is enc.conv_in.weight
    assert not any(isinstance(m, nn.Conv3d) for m in folded.modules())
    a, b = enc.state_dict(keep_vars=True), folded.state_dict(keep_vars=True)
    assert list(a) == list(b) and all(a[k] is b[k] for k in a)
    x = torch.rand(1, 3, 5, 16, 24) * 2 - 1
    with torch.no_grad():
        _close(enc(x), folded(x))
    stage = VAEDecodeStage(ref.vae, 1, fold=False)  # a wrapper holding bare convs as direct children
    folded_stage = fold_convs(stage, inplace=False)
    assert isinstance(stage.conv_in, CausalConv3d) and isinstance(folded_stage.conv_in, FoldedConv3d)
    z = torch.randn(1, stage.conv_in.in_channels, 3, 4, 6)
    with torch.no_grad():
        _close(stage(z), folded_stage(z))


def test_single_frame_sums_taps() -> None:
    conv = _seeded(CausalConv3d(4, 6))
    down = _seeded(Downsample3D(4, temporal=True))
    x = torch.randn(1, 4, 1, 9, 8)
    with torch.no_grad():
        want_c, want_d = conv(x), down(x)
        holder = fold_convs(nn.ModuleList([conv, down]), single_frame=True)
        folded_c, folded_d = holder[0], holder[1]
        _close(want_c, folded_c(x))
        _close(want_d, folded_d(x))
        assert folded_c.weight_2d().shape == (6, 4, 3, 3)
        with pytest.raises(ValueError, match="T=3"):
            folded_c(torch.randn(1, 4, 3, 9, 8))


# --- the whole tiny VAE ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_pair() -> tuple[M.SeedVR2, M.SeedVR2]:
    """Two identical tiny models (same seed): one stays as built, one gets folded."""
    ref, folded = M.from_preset("tiny", seed=0), M.from_preset("tiny", seed=0)
    fold_convs(folded.vae)
    return ref, folded


def test_tiny_vae_folded_has_no_conv3d(tiny_pair) -> None:
    ref, folded = tiny_pair
    assert not any(isinstance(m, nn.Conv3d) for m in folded.vae.modules())
    n_conv = sum(isinstance(m, nn.Conv3d) for m in ref.vae.modules())
    assert sum(isinstance(m, FoldedConv3d) for m in folded.vae.modules()) == n_conv
    assert list(folded.vae.state_dict()) == list(ref.vae.state_dict())


@pytest.mark.parametrize("t,h,w", [(1, 16, 24), (5, 32, 16)])
def test_tiny_vae_reference_and_wrappers_equal_unfolded(tiny_pair, t: int, h: int, w: int) -> None:
    """Reference encode/decode and the export wrappers (encoder, every decoder segment)."""
    ref, folded = tiny_pair
    x = torch.rand(1, 3, t, h, w, generator=torch.Generator().manual_seed(2)) * 2 - 1
    with torch.no_grad():
        for a, b in zip(ref.vae.encode_moments(x), folded.vae.encode_moments(x)):
            _close(a, b)
        for a, b in zip(VAEEncode(ref.vae, fold=False)(x), VAEEncode(ref.vae)(x)):  # export form folds
            _close(a, b)
        z = ref.vae.encode_moments(x)[0]
        _close(ref.vae.decode(z), folded.vae.decode(z))
        y = z
        for k in range(len(ref.vae.decoder.up_blocks)):
            want, got = VAEDecodeStage(ref.vae, k, fold=False)(y), VAEDecodeStage(ref.vae, k)(y)
            _close(want, got)
            if k < len(ref.vae.decoder.up_blocks) - 1:   # host depth-to-space between segments
                up = ref.vae.decoder.up_blocks[k].upsamplers[0]
                c = want.shape[1] // up.factor
                b_, _, f, hh, ww = want.shape
                if up.temporal:
                    y = want.reshape(b_, 2, 2, 2, c, f, hh, ww).permute(0, 4, 5, 3, 6, 1, 7, 2)
                    y = y.reshape(b_, c, f * 2, hh * 2, ww * 2)
                    y = torch.cat([y[:, :, :1], y[:, :, 2:]], dim=2)
                else:
                    y = want.reshape(b_, 2, 2, c, f, hh, ww).permute(0, 3, 4, 5, 1, 6, 2)
                    y = y.reshape(b_, c, f, hh * 2, ww * 2)


# --- pnnx -> ncnn ---------------------------------------------------------------------------------
class ConvChain(nn.Module):
    """Every folded variant in one graph: causal 3x3x3 + 1x1x1 shortcut, spatial and space-time
    downsample (with their pads), 1x1x1 upscale conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = CausalConv3d(3, 4)
        self.shortcut = CausalConv3d(3, 4, (1, 1, 1))
        self.down_s = Downsample3D(4, temporal=False)
        self.down_t = Downsample3D(4, temporal=True)
        self.upscale = nn.Conv3d(4, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.upscale(self.down_t(self.down_s(self.conv(x) + self.shortcut(x))))


@pytest.mark.slow
def test_folded_chain_converts_to_2d_convolutions_and_matches_in_ncnn(tmp_path) -> None:
    from ncnnport.contract import ModuleSpec, TensorSpec
    from ncnnport.convert.pnnx_runner import convert_module
    from ncnnport.export.tracing import export_module
    from ncnnport.runtime.session import NcnnModule

    ref = _seeded(ConvChain())
    folded = fold_convs(_seeded(ConvChain()))
    spec = ModuleSpec("conv_chain", lambda: folded, [TensorSpec("x", (1, 3, "t", "h", "w"))],
                      [TensorSpec("y", (1, 8, "lt", "lh", "lw"))],
                      axes={"t": (5, 9), "h": (16, 32), "w": (24, 16)})
    record = export_module(spec, tmp_path / "ts")
    receipt = convert_module(record, tmp_path / "ts" / "conv_chain.pt", tmp_path / "ncnn")
    types = receipt["layer_types"]
    assert types.get("Convolution") == 5 and "Convolution3D" not in types, types
    param = (tmp_path / "ncnn" / "conv_chain.ncnn.param").read_text()
    assert "Convolution3D" not in param and "MemoryData" not in param   # weights folded into convs
    ncnn_dir = tmp_path / "ncnn"
    mod = NcnnModule(ncnn_dir / "conv_chain.ncnn.param", ncnn_dir / "conv_chain.ncnn.bin", record)
    # two sizes beyond the trace sizes, T=1 among them (T odd and H, W multiples of 8: the VAE's)
    for t, h, w in ((1, 64, 40), (13, 40, 24)):
        x = torch.randn(1, 3, t, h, w, generator=torch.Generator().manual_seed(t))
        with torch.no_grad():
            want = ref(x).numpy()
        got = mod.run([x.numpy()])[0].reshape(want.shape)
        assert np.abs(want - got).max() <= 1e-5 * max(1.0, np.abs(want).max())
