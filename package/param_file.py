"""Read, check and write ncnn ``.param`` text files.

Parsing is strict on purpose: a truncated param, a foreign file or an op ncnn cannot load must
fail here with the file named, not later inside ncnn with a bare ``-1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

PARAM_MAGIC = "7767517"

# ncnn layer types whose load_model reads nothing from the .bin (ncnn 1.0.20261020). The int8
# rewrite's .bin walk skips exactly these and fails on any other type it does not know (a guess
# would shift every later offset); graph rewrites that must not touch weights stop at any type
# outside this set.
WEIGHTLESS_TYPES = frozenset({
    "Input", "Split", "BinaryOp", "UnaryOp", "Reshape", "Permute", "ExpandDims", "Squeeze",
    "Flatten", "Concat", "Slice", "Crop", "Reduction", "MatMul", "SDPA", "RotaryEmbed", "Softmax",
    "Swish", "GELU", "Sigmoid", "ReLU", "Clip", "TanH", "Noop", "Dropout", "Eltwise", "Mish",
})


class ParamError(ValueError):
    """A param file is malformed or holds layers ncnn cannot run."""


@dataclass
class ParamLayer:
    type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    params: list[tuple[str, str]] = field(default_factory=list)  # ordered key=value pairs

    def get(self, key: str) -> str | None:
        for k, v in self.params:
            if k == key:
                return v
        return None

    def set(self, key: str, value: str) -> None:
        for i, (k, _) in enumerate(self.params):
            if k == key:
                self.params[i] = (k, value)
                return
        self.params.append((key, value))

    def to_line(self) -> str:
        head = [self.type.ljust(24), self.name.ljust(24), str(len(self.inputs)), str(len(self.outputs))]
        body = self.inputs + self.outputs + [f"{k}={v}" for k, v in self.params]
        return " ".join(head + body)


@dataclass
class ParamGraph:
    path: Path
    layers: list[ParamLayer]
    blob_count: int

    def blob_names(self) -> set[str]:
        names: set[str] = set()
        for layer in self.layers:
            names.update(layer.inputs)
            names.update(layer.outputs)
        return names

    def layer_types(self) -> list[str]:
        return [layer.type for layer in self.layers]

    def unsupported_layers(self) -> list[ParamLayer]:
        """Layers pnnx let through that ncnn cannot create (``pnnx.Expression``, ``Tensor.expand``...)."""
        return [layer for layer in self.layers if "." in layer.type]

    def write(self, path: Path) -> None:
        lines = [PARAM_MAGIC, f"{len(self.layers)} {self.blob_count}"]
        lines += [layer.to_line() for layer in self.layers]
        from ncnnport.fsutil import atomic_write_text
        atomic_write_text(Path(path), "\n".join(lines) + "\n")


def read_param(path: Path) -> ParamGraph:
    path = Path(path)
    try:
        text = path.read_text()
    except UnicodeDecodeError as exc:
        raise ParamError(f"{path}: not a text ncnn param file") from exc
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or lines[0].strip() != PARAM_MAGIC:
        raise ParamError(f"{path}: missing ncnn param magic {PARAM_MAGIC} on the first line")
    try:
        layer_count, blob_count = (int(x) for x in lines[1].split())
    except (IndexError, ValueError) as exc:
        raise ParamError(f"{path}: second line must be '<layer_count> <blob_count>'") from exc
    body = lines[2:]
    if len(body) != layer_count:
        raise ParamError(f"{path}: header announces {layer_count} layers, file has {len(body)} "
                         "(truncated or edited param)")
    layers = []
    for lineno, line in enumerate(body, start=3):
        tok = line.split()
        try:
            n_in, n_out = int(tok[2]), int(tok[3])
            ins = tok[4:4 + n_in]
            outs = tok[4 + n_in:4 + n_in + n_out]
            if len(ins) != n_in or len(outs) != n_out:
                raise ValueError
            params = []
            for kv in tok[4 + n_in + n_out:]:
                k, v = kv.split("=", 1)
                params.append((k, v))
        except (IndexError, ValueError) as exc:
            raise ParamError(f"{path}:{lineno}: malformed layer line {line[:80]!r}") from exc
        layers.append(ParamLayer(tok[0], tok[1], ins, outs, params))
    return ParamGraph(path, layers, blob_count)


def check_loadable(graph: ParamGraph, *, module: str) -> None:
    """Fail when pnnx left ops ncnn cannot load; pnnx itself exits 0 in that case."""
    bad = graph.unsupported_layers()
    if bad:
        listed = ", ".join(f"{layer.type} ({layer.name})" for layer in bad[:8])
        raise ParamError(f"module {module}: {graph.path.name} holds {len(bad)} layer(s) ncnn cannot "
                         f"load: {listed}. Rewrite the wrapper so pnnx lowers them to ncnn layers.")
