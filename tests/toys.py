"""Toy modules and specs for testing the generic stages without a real model."""

from __future__ import annotations

import torch

from ncnnport.contract import ModuleSpec, TensorSpec


class ToyAttention(torch.nn.Module):
    """RMSNorm -> Linear -> masked attention, and a row sum: small but with a dynamic axis,
    a mask input and two outputs, like the real split modules."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.norm = torch.nn.RMSNorm(16, eps=1e-6)
        self.proj = torch.nn.Linear(16, 8)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(8, 16, generator=g) * 0.3)
            self.proj.bias.copy_(torch.randn(8, generator=g) * 0.1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor):
        h = self.proj(self.norm(x))
        a = torch.softmax(h @ h.transpose(1, 2) + mask, dim=-1) @ h
        return a, h.sum(-1, keepdim=True)


def toy_spec(module: torch.nn.Module | None = None, **overrides) -> ModuleSpec:
    module = module if module is not None else ToyAttention().eval()
    fields = dict(
        name="toy", build=lambda: module,
        inputs=[TensorSpec("x", (1, "seq", 16)), TensorSpec("mask", (1, "seq", "seq"))],
        outputs=[TensorSpec("attn", (1, "seq", 8)), TensorSpec("rowsum", (1, "seq", 1))],
        axes={"seq": (5, 9)}, parity_sizes=[{"seq": 1}, {"seq": 23}])
    fields.update(overrides)
    return ModuleSpec(**fields)
