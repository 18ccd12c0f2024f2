"""The model kit: ``load`` from declared hooks and the one ``--layers`` truncation."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ncnnport.models.kit import KitPort, LayerStack, truncate


@dataclasses.dataclass(frozen=True)
class Text:
    layers: int
    kinds: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Config:
    text: Text
    audio: Any

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text.layers, "audio": self.audio.layers}


STACKS = (LayerStack("text.layers", "text layers", ("text.kinds",)), LayerStack("audio.layers", "audio layers"))


def _config() -> Config:
    return Config(Text(4, ("a", "b", "c", "d")), SimpleNamespace(layers=3))


def test_truncate_cuts_every_stack_and_its_per_layer_lists_without_touching_the_input() -> None:
    cfg = _config()
    cut = truncate(cfg, STACKS, 2, "toy")
    assert (cut.text.layers, cut.text.kinds, cut.audio.layers) == (2, ["a", "b"], 2)
    assert (cfg.text.layers, cfg.audio.layers) == (4, 3)     # frozen and plain objects both copied
    assert truncate(cfg, STACKS, None, "toy") is cfg


@pytest.mark.parametrize("bad", [0, 4])
def test_truncate_refuses_counts_outside_every_stack_in_one_line(bad: int) -> None:
    with pytest.raises(ValueError, match=rf"^--layers {bad}: toy has 4 text layers, 3 audio layers \(use 1..3\)$"):
        truncate(_config(), STACKS, bad, "toy")


class ToyPort(KitPort):
    name = "toy"
    presets = ("tiny", "real")
    layer_stacks = STACKS

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def config_folder(self, preset: str, ckpt: Path | None) -> Path:
        return Path(ckpt) if ckpt else Path(f"/presets/{preset}")

    def read_config(self, folder: Path, preset: str) -> Config:
        return _config()

    def seeded(self, config: Config, seed: int) -> Any:
        self.calls.append(("seeded", (config.text.layers, seed)))
        return SimpleNamespace(config=config)

    def from_folder(self, folder: Path, config: Config, truncated: bool) -> Any:
        self.calls.append(("folder", (folder, config.text.layers, truncated)))
        return SimpleNamespace(config=config)

    def assets(self, folder: Path) -> dict[str, Path]:
        return {"tokenizer.json": folder / "tokenizer.json"}

    def e2e_parity(self, ctx: Any) -> list[dict[str, Any]]:
        return []


def test_load_picks_the_weight_source_from_preset_and_checkpoint() -> None:
    port = ToyPort()
    real = port.load("real", None, layers=2)
    assert port.calls[-1] == ("seeded", (2, 0)) and real.config == {"text": 2, "audio": 2}
    assert real.extra == {"layers": 2}
    tiny = port.load("tiny", None)
    assert port.calls[-1] == ("folder", (Path("/presets/tiny"), 4, False))
    assert tiny.assets == {"tokenizer.json": Path("/presets/tiny/tokenizer.json")}
    port.load("real", Path("/ckpt"), layers=1)          # a checkpoint wins over a seeded preset
    assert port.calls[-1] == ("folder", (Path("/ckpt"), 1, True))


def test_every_registered_port_is_built_on_the_kit() -> None:
    from ncnnport.registry import available_models, get_port

    for name in available_models():
        port = get_port(name)
        assert isinstance(port, KitPort) and port.layer_stacks, name
