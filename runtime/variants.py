"""Swap a package's graphs for one of their declared variants (see ``contract.GraphVariant``).

Why a mapping: a pipeline addresses graphs by name, so running its decode steps on the
``decode`` variants (InnerProduct, fp16 weights under ``use_fp16_storage``) needs no change in
the pipeline beyond which mapping it is handed for those steps.
"""

from __future__ import annotations

from typing import Any, Mapping

from ncnnport.runtime.options import RuntimeOptions


def with_variant(modules: Mapping[str, Any], variant: str, options: RuntimeOptions | None = None,
                 names: list[str] | None = None) -> dict[str, Any]:
    """``modules`` (or only ``names`` of them) with every graph that declares ``variant``
    reopened as that variant under ``options`` (default: the graph's own options); graphs
    without it are passed through unchanged. At least one graph must declare the variant:
    asking for one the package does not have is an error, not a silent fp32 run."""
    picked = list(modules) if names is None else list(names)
    out = {n: modules[n] for n in picked}
    swapped = 0
    for n in picked:
        mod = out[n]
        if variant in getattr(mod, "variants", lambda: [])():
            out[n] = mod.variant(variant, options)
            swapped += 1
    if not swapped:
        raise KeyError(f"no graph among {len(picked)} declares the variant {variant!r}")
    return out
