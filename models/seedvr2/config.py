"""Architecture configs for SeedVR2: the real 3B model and a tiny preset with the same structure.

The config is plain data (JSON round-trip via ``to_json``/``from_json``) because it is written
into checkpoint folders and hashed into package manifests. Field names follow the official
configs_3b/main.yaml where one exists.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from ncnnport.models.kit import LayerStack


@dataclass(frozen=True)
class DiTConfig:
    """NaDiT hyper-parameters (spec section 1)."""

    vid_in_channels: int = 33           # 16 noise + 16 LQ latent + 1 mask
    vid_out_channels: int = 16
    vid_dim: int = 2560
    txt_in_dim: int = 5120
    txt_dim: int = 2560
    heads: int = 20
    head_dim: int = 128
    mlp_hidden: int = 6912              # SwiGLU hidden: 2/3 * 4 * dim rounded up to 256
    num_layers: int = 32
    mm_layers: int = 10                 # blocks [0, mm_layers) have separate vid/txt weights
    patch_size: tuple[int, int, int] = (1, 2, 2)
    norm_eps: float = 1e-5
    sinusoidal_dim: int = 256
    rope_theta: float = 10000.0
    window: tuple[int, int, int] = (4, 3, 3)   # number of windows (t, h, w) at the 720p area
    window_area: int = 3600                     # 45 x 80 patched tokens
    window_max_t: int = 30

    @property
    def emb_dim(self) -> int:
        """Time embedding width: 6 modulation vectors (2 layers x shift/scale/gate)."""
        return 6 * self.vid_dim

    @property
    def rope_axis_dim(self) -> int:
        """Channels rotated per axis (t, h, w): head_dim // 3 rounded down to even (42 at 128)."""
        d = self.head_dim // 3
        return d - (d % 2)

    @property
    def patch_features(self) -> int:
        pt, ph, pw = self.patch_size
        return self.vid_in_channels * pt * ph * pw

    def shared_weights(self, block: int) -> bool:
        return block >= self.mm_layers

    def is_last(self, block: int) -> bool:
        return block == self.num_layers - 1


@dataclass(frozen=True)
class VAEConfig:
    """video_vae_v3 s8_c16_t4 hyper-parameters (spec section 4)."""

    in_channels: int = 3
    latent_channels: int = 16
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    norm_groups: int = 32
    norm_eps: float = 1e-6
    temporal_down_blocks: tuple[int, ...] = (1, 2)   # encoder blocks with a time stride
    scaling_factor: float = 0.9152
    logvar_min: float = -30.0
    logvar_max: float = 20.0

    @property
    def spatial_factor(self) -> int:
        return 2 ** (len(self.block_out_channels) - 1)

    @property
    def temporal_factor(self) -> int:
        return 2 ** len(self.temporal_down_blocks)


@dataclass(frozen=True)
class SeedVR2Config:
    dit: DiTConfig = field(default_factory=DiTConfig)
    vae: VAEConfig = field(default_factory=VAEConfig)
    text_len: int = 58          # official positive prompt embedding: 58 x 5120
    timestep: float = 1000.0    # the single Euler step
    schedule_T: float = 1000.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(data: Mapping[str, Any], source: str = "config") -> "SeedVR2Config":
        """Strict: every field of every section must be present (no silent defaults: a
        checkpoint whose config lacks ``rope_theta`` would otherwise run with 10000 and look
        fine), and no unknown keys. Errors name the field and ``source`` (the file)."""
        data = dict(data)
        top = {f.name for f in dataclasses.fields(SeedVR2Config)} - {"dit", "vae"}
        dit = _section(DiTConfig, data.pop("dit", None), "dit", source)
        vae = _section(VAEConfig, data.pop("vae", None), "vae", source)
        _check_keys(data, top, "", source)
        return SeedVR2Config(dit=dit, vae=vae, **data)


def _check_keys(d: Mapping[str, Any], names: set[str], prefix: str, source: str) -> None:
    """Unknown or missing keys of one config section -> ValueError naming the first one."""
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"{source}: unknown config field {prefix}{unknown[0]}"
                         + (f" (and {len(unknown) - 1} more: {unknown[1:]})" if len(unknown) > 1 else ""))
    missing = sorted(names - set(d))
    if missing:
        raise ValueError(f"{source}: config field {prefix}{missing[0]} is missing"
                         + (f" (also missing: {', '.join(prefix + m for m in missing[1:])})" if len(missing) > 1 else "")
                         + "; every field must be given, there are no defaults for checkpoints")


def _section(cls: type, d: Any, name: str, source: str) -> Any:
    """One nested section (``dit``/``vae``), complete, lists turned back into tuples."""
    if not isinstance(d, Mapping):
        raise ValueError(f"{source}: config section {name!r} is missing or not an object")
    _check_keys(d, {f.name for f in dataclasses.fields(cls)}, f"{name}.", source)
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


REAL = SeedVR2Config()
# projects/inference_seedvr2_3b.py's default --seed (here, not in the torch pipeline, so that the
# run verb's options parse where torch is absent)
OFFICIAL_SEED = 666

# Same structure (mm blocks then shared blocks, last-block quirks, 4 VAE stages with the same
# down/up-sampling pattern, 16 latent channels, 33-channel condition), small widths.
TINY = SeedVR2Config(
    dit=DiTConfig(vid_dim=64, txt_in_dim=96, txt_dim=64, heads=2, head_dim=32, mlp_hidden=192,
                  num_layers=4, mm_layers=2),
    vae=VAEConfig(block_out_channels=(8, 16, 32, 32), norm_groups=4),
    text_len=7,
)

PRESETS: dict[str, SeedVR2Config] = {"tiny": TINY, "real": REAL}


LAYER_STACKS = (LayerStack("dit.num_layers", "DiT blocks"),)
"""``--layers K`` keeps the first K DiT blocks. The truncated DiT is a complete NaDiT of K blocks:
block K-1 takes the last-block role (``DiTConfig.is_last``: video-only ada/MLP, unmodulated text
in attention, no text output), exactly as block 31 does in the full model, so the output head
always follows a last block and the K-block model exercises both official quirks. Its tensors
keep their full-model names and shapes (``blocks.{K-1}.mlp.vid.*`` exists in the full model too;
the text-stream tensors it no longer uses are simply never read), so seeded values and
checkpoint reads are the same as in the whole model. ``mm_layers`` is kept: blocks below it stay
separate-weight."""
