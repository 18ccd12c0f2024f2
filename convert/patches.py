"""Apply declarative ParamPatch rules to a parsed ncnn param graph."""

from __future__ import annotations

import re
from typing import Sequence

from ncnnport.contract import ParamPatch
from ncnnport.package.param_file import ParamError, ParamGraph


def apply_patches(graph: ParamGraph, patches: Sequence[ParamPatch], *, module: str) -> list[dict]:
    """Edit ``graph`` in place; returns one receipt per patch (which layers changed).

    A patch matching fewer than ``min_matches`` layers raises: the graph it was written for
    has changed, and shipping it unpatched is the silent failure we exist to prevent.
    """
    receipts = []
    for patch in patches:
        changed = []
        for layer in graph.layers:
            if layer.type != patch.layer_type:
                continue
            if all((v := layer.get(k)) is not None and re.fullmatch(rx, v) for k, rx in patch.where.items()):
                before = {k: layer.get(k) for k in patch.set}
                for k, v in patch.set.items():
                    layer.set(k, v)
                changed.append({"layer": layer.name, "before": before, "after": dict(patch.set)})
        if len(changed) < patch.min_matches:
            raise ParamError(
                f"module {module}: patch on {patch.layer_type} where {dict(patch.where)} matched "
                f"{len(changed)} layer(s), needs >= {patch.min_matches} ({patch.why or 'no reason given'})")
        receipts.append({**patch.to_json(), "changed": changed})
    return receipts
