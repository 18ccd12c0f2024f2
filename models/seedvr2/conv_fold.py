"""Export-time rewrite of the VAE's 3-D convolutions into 2-D convolutions ("conv folding").

Why: pnnx turns every ``nn.Conv3d`` into ncnn ``Convolution3D``, which has no optimised x86
kernel (the real-width VAE encode at 256x256 ran 148 s in ncnn against 4.8 s in torch, one
thread), while ncnn's 2-D ``Convolution`` has im2col/sgemm/winograd paths (folded, the same
encode ran 2.5 s; a 128-channel 3x3x3 conv at 64x64 went from 580 ms to 13 ms). Every 3-D conv
of the causal VAE is separable into "temporal taps" and a per-frame 2-D conv, and both folds
below are pure data movement around ONE ``F.conv2d``:

* time into channels: a causal conv with ``kt`` temporal taps sees, for output frame ``t``, the
  input frames ``t*st + k - (kt-1)`` (``k < kt``, frame 0 repeated for negative indices). The
  ``kt`` shifted views are concatenated along channels, and the weight
  ``(Cout, Cin, kt, kh, kw)`` is regrouped to ``(Cout, kt*Cin, kh, kw)`` with the same order;
* frames into rows: ``(B, K, T, H, W)`` is reshaped to ``(B, K, T*Hb, W)`` with every frame
  padded at the bottom to a block of ``Hb`` rows. The zero rows between blocks serve as the
  bottom padding of one frame and the top padding of the next, so a 2-D conv with the original
  spatial padding never mixes frames; the output is reshaped back to ``(B, Cout, T, Hb/sh, W')``
  and each block's valid rows are kept. ``Hb`` is a multiple of the row stride so every block
  starts on an output row.

The regrouped weight is computed inside ``forward`` from the shared ``nn.Parameter``: torch holds
the weight once, and pnnx folds the permute + reshape into the ``Convolution`` weight at export
(its constant folding), so the ncnn ``.bin`` also holds one copy, now in 2-D layout.

Use at export time (see :func:`fold_convs`)::

    enc = fold_convs(vae.encoder, inplace=False)   # new module shells, the same Parameters
    torch.jit.trace(wrapper_over(enc), example)    # -> pnnx -> ncnn Convolution, no Convolution3D

Costs: the ``kt`` temporal views are concatenated, so a conv's input is materialised at
``kt*C`` channels for ``T`` frames (Convolution3D's causal input held ``(T+kt-1)*C``
frame-channels: equal at T=1, up to ``kt`` times more for long clips); ncnn's winograd kernels keep
transformed weights (the folded real encoder is 1.5 GB resident after load for a 382 MB
``.bin``). ``single_frame=True`` (image graphs) removes the time fold altogether.

Trace-time constants (documented limits of a *traced* graph, never of eager calls): the number of
padding rows that makes a block a multiple of the row stride, and the frame pairing of a
time-strided conv, depend on the parity of H (stride-2 rows) and of T (stride-2 time). They are
computed from the example input when traced, so the traced graph is right for every size with the
same parities. The VAE only strides over even heights (H a multiple of 8 => every downsample sees
``H+1`` odd rows after its right/bottom pad) and odd frame counts (``4n+1``), so one trace at
valid sizes serves every valid size.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ncnnport.models.seedvr2.vae import CausalConv3d

__all__ = ["FoldedConv3d", "fold_convs", "unfold_convs", "folded_convs", "foldable"]


def foldable(conv: nn.Module) -> bool:
    """Whether ``conv`` is a 3-D conv this module can fold exactly.

    Folded: every :class:`CausalConv3d` (any kernel, stride, spatial padding, no temporal
    padding), and plain ``nn.Conv3d`` with a ``1x1x1`` kernel, stride 1, no padding (the VAE's
    ``upscale_conv``; a non-causal conv with temporal extent would need symmetric time padding,
    which the VAE never uses). Dilation and groups must be 1 and padding mode zeros.
    """
    if not isinstance(conv, nn.Conv3d) or isinstance(conv, FoldedConv3d):
        return False
    if conv.groups != 1 or tuple(conv.dilation) != (1, 1, 1) or conv.padding_mode != "zeros":
        return False
    if isinstance(conv.padding, str):
        return False
    if isinstance(conv, CausalConv3d):
        return conv.padding[0] == 0
    return (tuple(conv.kernel_size) == (1, 1, 1) and tuple(conv.stride) == (1, 1, 1)
            and tuple(conv.padding) == (0, 0, 0))


class FoldedConv3d(nn.Module):
    """The function of a (causal) ``Conv3d`` computed with one ``F.conv2d``.

    Holds the original conv's ``weight`` and ``bias`` Parameters themselves (not copies), under
    the same attribute names, so ``state_dict`` keys, parameter counts and weight sharing are
    those of the module it replaces. Input ``(B, C, T, H, W)``, output as the original conv's.

    ``single_frame=True`` is an opt-in variant for graphs that only ever see ``T == 1`` (the
    image VAE): with one frame every causal temporal tap reads frame 0, so the taps' weights are
    summed (in ``forward``, from the same Parameter) and the conv has ``Cin`` instead of
    ``kt*Cin`` input channels: ``kt`` times fewer multiply-adds and a ``kt`` times smaller ncnn
    weight. Eager calls with ``T != 1`` raise; a traced graph silently assumes ``T == 1``.
    """

    def __init__(self, conv: nn.Conv3d, *, single_frame: bool = False) -> None:
        super().__init__()
        if not foldable(conv):
            raise ValueError(f"cannot fold {conv!r}: see conv_fold.foldable")
        self.weight = conv.weight            # the same Parameter objects: no copy, same names
        self.bias = conv.bias
        self.causal = isinstance(conv, CausalConv3d)
        self.kernel_size: tuple[int, int, int] = tuple(conv.kernel_size)
        self.stride: tuple[int, int, int] = tuple(conv.stride)
        self.padding: tuple[int, int, int] = tuple(conv.padding)
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.single_frame = single_frame
        # the replaced module, kept outside the module tree (not a child: its Parameters would
        # appear twice in state_dict) so unfold_convs can put it back
        object.__setattr__(self, "_original", conv)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, causal={self.causal}, "
                f"single_frame={self.single_frame}")

    # --- weights ----------------------------------------------------------------------------
    def weight_2d(self) -> torch.Tensor:
        """``(Cout, Cin, kt, kh, kw)`` -> ``(Cout, kt*Cin, kh, kw)``, tap-major to match the
        channel order of :meth:`temporal_views` (single-frame: taps summed, ``(Cout, Cin, kh, kw)``)."""
        w = self.weight
        if self.single_frame:
            return w.sum(dim=2)
        cout, cin, kt, kh, kw = w.shape
        return w.permute(0, 2, 1, 3, 4).reshape(cout, kt * cin, kh, kw)

    # --- time -> channels -------------------------------------------------------------------
    def temporal_views(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, T, H, W)`` -> ``(B, kt*C, T_out, H, W)``: tap ``k`` of output frame ``j`` is
        padded frame ``j*st + k`` (padded = ``kt-1`` copies of frame 0, then the input).

        Every slice along T ends at an index computed from ``x.shape[2]``, never at a constant:
        pnnx 20261020 deletes a slice with constant bounds on a dynamic axis as a no-op (both
        shapes read ``?``), which silently turned ``x[:, :, 1:]`` into ``x``."""
        kt, st = self.kernel_size[0], self.stride[0]
        t = x.shape[2]
        if self.single_frame:
            if not torch.jit.is_tracing() and t != 1:
                raise ValueError(f"single_frame fold called with T={t} frames")
            return x
        if kt == 1 and st == 1:
            return x
        xp = torch.cat([x[:, :, :1]] * (kt - 1) + [x], dim=2) if kt > 1 else x
        if st == 1:
            views = [xp[:, :, k: k + t] for k in range(kt)]
            return torch.cat(views, dim=1) if kt > 1 else views[0]
        if st != 2:
            raise NotImplementedError(f"time stride {st}: only 1 and 2 are folded")
        return torch.cat(self._stride2_taps(xp, kt, (t + 1) // 2), dim=1)

    @staticmethod
    def _stride2_taps(xp: torch.Tensor, kt: int, t_out: int) -> list[torch.Tensor]:
        """Taps of a time-stride-2 conv without a strided slice (ncnn ``Crop`` has no step).

        Padded frames are paired by a reshape ``(B, C, P, H, W) -> (B, C, ceil(P/2), 2H, W)``:
        the top half of pair ``j`` is padded frame ``2j``, the bottom half frame ``2j+1``.
        Output frame ``j`` reads padded frame ``2j + k`` for tap ``k``, i.e. pair ``j + k//2``,
        half ``k % 2``, so each tap is a slice of ``t_out`` pairs. One junk frame is appended
        when ``P`` is odd so the pairing reshape is whole (the parity of T is a trace-time
        constant, see the module notes); the junk is never read."""
        b, c, p, h, w = xp.shape
        if _static(p) % 2:
            xp = torch.cat([xp, xp[:, :, :1]], dim=2)
        pairs = xp.reshape(b, c, -1, 2 * h, w)
        halves = (pairs[:, :, :, :h], pairs[:, :, :, h:])
        return [halves[k % 2][:, :, k // 2: k // 2 + t_out] for k in range(kt)]

    # --- frames -> rows -----------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, kh, kw = self.kernel_size
        _, sh, sw = self.stride
        _, ph, pw = self.padding
        y = self.temporal_views(x)                       # (B, K, T', Hin, Win)
        b, k, _, h_in, w_in = y.shape
        # block height Hb = Hin + extra: >= ph zero rows below each frame (they double as the
        # next frame's top padding), room for every output row of the frame (Hb/sh >= H_out,
        # which only binds when 2*ph >= kh), and a multiple of the row stride, so every block
        # starts on an output row
        extra = max(ph, 2 * ph - kh + sh)
        extra += (-(_static(h_in) + extra)) % sh
        if extra:
            y = F.pad(y, (0, 0, 0, extra))
        hb = h_in + extra
        y = y.reshape(b, k, -1, w_in)                    # (B, K, T'*Hb, Win)
        # the conv yields T'*Hb/sh + surplus rows; surplus depends on the kernel only
        surplus = (2 * ph - kh) // sh + 1
        if surplus < 0:
            y = F.pad(y, (0, 0, 0, -surplus * sh))
        y = F.conv2d(y, self.weight_2d(), self.bias, stride=(sh, sw), padding=(ph, pw))
        if surplus > 0:
            y = y[:, :, : y.shape[2] - surplus]
        y = y.reshape(b, self.out_channels, -1, hb // sh, y.shape[-1])
        # rows of a block past the frame's last output row (static count, dynamic bound)
        if (2 * ph - kh - extra) // sh + 1 < 0:
            y = y[:, :, :, : (h_in + 2 * ph - kh) // sh + 1]
        return y


def _static(n: int) -> int:
    """A size as a plain int. Under ``torch.jit.trace`` this bakes the example's value into the
    graph; it is used only for parities (see the module notes), so the TracerWarning it would
    raise is expected and silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return int(n)


# --- swapping ---------------------------------------------------------------------------------
def fold_convs(module: nn.Module, *, single_frame: bool = False, inplace: bool = True) -> nn.Module:
    """Every foldable 3-D conv reachable from ``module`` replaced by a :class:`FoldedConv3d`
    over the same Parameters. Use the return value.

    ``inplace=True`` swaps the convs inside ``module`` and returns it (when ``module`` is itself
    a foldable conv, which cannot be swapped inside itself, its folded replacement is returned).
    This mutates every submodule ``module`` shares with other objects: a wrapper holding
    ``vae.encoder`` folds ``vae.encoder`` itself, so the reference model computes through the
    folded convs from then on (same function, float-rounding differences only).

    ``inplace=False`` leaves ``module`` untouched and returns a structural copy: every module on
    the tree is a new shell (own child table) holding the SAME Parameter and buffer objects, so
    nothing is copied but the module objects; the original keeps its ``Conv3d`` layers.
    Wrappers that share the reference model (the in-memory ``SeedVR2.view`` returns the model's
    own submodules) should fold this way.

    Either way ``state_dict`` keys and tensors are those of the original, and a conv reachable
    under several parents (or names) becomes ONE folded module at every place, so sharing is
    preserved. ``single_frame=True`` folds for graphs that see exactly one frame (see
    :class:`FoldedConv3d`); the default is exact for every T.
    """
    memo: dict[int, nn.Module] = {}
    if not inplace:
        return _folded_copy(module, memo, single_frame)
    if foldable(module):
        return FoldedConv3d(module, single_frame=single_frame)
    for parent in list(module.modules()):
        for name, child in list(parent._modules.items()):
            if child is not None and foldable(child):
                if id(child) not in memo:
                    memo[id(child)] = FoldedConv3d(child, single_frame=single_frame)
                setattr(parent, name, memo[id(child)])
    return module


def _folded_copy(module: nn.Module, memo: dict[int, nn.Module], single_frame: bool) -> nn.Module:
    """New module shells down the tree, convs folded, Parameters and buffers shared (by object)."""
    if id(module) in memo:
        return memo[id(module)]
    if foldable(module):
        new: nn.Module = FoldedConv3d(module, single_frame=single_frame)
    else:
        new = copy.copy(module)          # shallow: the attribute dicts below are still shared
        new.__dict__["_parameters"] = dict(module._parameters)
        new.__dict__["_buffers"] = dict(module._buffers)
        new.__dict__["_non_persistent_buffers_set"] = set(module._non_persistent_buffers_set)
        new.__dict__["_modules"] = {}
        memo[id(module)] = new           # before the children: a cycle maps to this shell
        for name, child in module._modules.items():
            new._modules[name] = None if child is None else _folded_copy(child, memo, single_frame)
    memo[id(module)] = new
    return new


def unfold_convs(module: nn.Module) -> nn.Module:
    """Put back the original conv modules that :func:`fold_convs` replaced (in place); returns
    ``module`` (or the original conv when ``module`` is itself a folded conv)."""
    if isinstance(module, FoldedConv3d):
        return module._original
    for parent in list(module.modules()):
        for name, child in list(parent._modules.items()):
            if isinstance(child, FoldedConv3d):
                setattr(parent, name, child._original)
    return module


@contextlib.contextmanager
def folded_convs(module: nn.Module, *, single_frame: bool = False) -> Iterator[nn.Module]:
    """``with folded_convs(wrapper) as m: torch.jit.trace(m, ...)`` - folded in place inside the
    block, restored after it (also on error), for models shared with code that expects
    ``Conv3d`` afterwards."""
    folded = fold_convs(module, single_frame=single_frame)
    try:
        yield folded
    finally:
        unfold_convs(folded)
