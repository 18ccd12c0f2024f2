"""What a SeedVR2 package records for a runtime without torch (``model.json``, the positive
text embedding, the host tables) and its packaged e2e cases: input frames, the explicit noise,
and the torch reference's restored frames (``expected.png``, sha256 + statistics), with the seed
and area that produced them. ``packaged.py`` runs them torch-free (``verify``)."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import numpy as np

from ncnnport.package.cases import PackageCase

TEXT_EMBEDDING = "assets/text_embedding.npy"
HOST_TABLES = "assets/host_tables.npz"
# RoPE positions the host tables cover beyond the text: window-local h/w extents up to this many
# patched tokens (the windows are rescaled to the 720p token area, so only an aspect ratio beyond
# about 2600:1 needs more); the time axis needs text_len + ceil(window_max_t / windows_t).
ROPE_TABLE_EXTENT = 1024


def rope_table_positions(cfg: Any) -> int:
    """How many integer RoPE positions the packaged tables hold."""
    return cfg.text_len + ROPE_TABLE_EXTENT


def host_tables_npz(cfg: Any) -> bytes:
    """``assets/host_tables.npz``: torch's cos/sin of every (position, frequency) RoPE angle up to
    :func:`rope_table_positions` and the timestep sinusoid at ``cfg.timestep``, so the torch-free
    host builds the run path's tables bit for bit (``host_numpy.TrigTables``)."""
    from ncnnport.models.seedvr2.runner import TorchTrig

    trig = TorchTrig(cfg)
    cos, sin = trig.angles(np.arange(rope_table_positions(cfg), dtype=np.int64))
    buf = io.BytesIO()
    np.savez(buf, rope_cos=np.ascontiguousarray(cos, np.float32), rope_sin=np.ascontiguousarray(sin, np.float32),
             sinusoid=np.ascontiguousarray(trig.timestep_sinusoid(cfg.timestep), np.float32))
    return buf.getvalue()


def describe(cfg: Any, area_rule: str) -> dict[str, Any]:
    """The ``model.json`` body: the strict config plus the host rules spelled out."""
    from ncnnport.models.seedvr2.config import OFFICIAL_SEED
    from ncnnport.models.seedvr2.pipeline import NOISE_DTYPE

    return {
        "config": cfg.to_json(),
        "dims": {"vid_dim": cfg.dit.vid_dim, "blocks": cfg.dit.num_layers, "heads": cfg.dit.heads,
                 "head_dim": cfg.dit.head_dim, "latent_channels": cfg.vae.latent_channels,
                 "spatial_factor": cfg.vae.spatial_factor, "temporal_factor": cfg.vae.temporal_factor,
                 "text_len": cfg.text_len},
        "rope": {"theta": cfg.dit.rope_theta, "rule": "3-D MM-RoPE over (t, h, w) of the patched video and the text positions",
                 "table_positions": rope_table_positions(cfg),
                 "tables": "files.host_tables: torch's cos/sin of position * freq_k per integer position, and the "
                           "timestep sinusoid at schedule.timestep"},
        "windows": {"count_at_720p": list(cfg.dit.window), "window_area": cfg.dit.window_area,
                    "window_max_t": cfg.dit.window_max_t,
                    "rule": "window counts scale with the patched grid relative to the 720p area (windows.partition)"},
        "preprocessing": {"resize": "area resize keeping the aspect ratio (round(h*s), round(w*s)), s = sqrt(area/(h*w)); "
                                    "bicubic, antialiased, align_corners=False, clamped to [0, 1]",
                          "area": area_rule, "crop": "centre crop to a multiple of 16, offset int(round(margin / 2))",
                          "frames": "padded to 4n+1 by repeating the last frame", "range": "[-1, 1]"},
        "latent": {"scaling_factor": cfg.vae.scaling_factor, "posterior": "mean + exp(logvar/2) * eps, times scale"},
        "schedule": {"timestep": cfg.timestep, "schedule_T": cfg.schedule_T,
                     "rule": "one Euler step: x0 = x_T - v * timestep / schedule_T (velocity prediction)"},
        "noise": {"seed": OFFICIAL_SEED, "dtype": str(NOISE_DTYPE).replace("torch.", ""),
                  "order": "posterior eps (1,C,t,h,w) contiguous, then x_T drawn channels-last; torch generator"},
        "colour_fix": "wavelet colour fix against the preprocessed input (5 levels, dilated 3x3 binomial blur)",
        "files": {"text_embedding": TEXT_EMBEDDING, "host_tables": HOST_TABLES},
    }


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def noise_npz(x_T: np.ndarray, posterior: np.ndarray | None) -> bytes:
    """The case's explicit noise as an ``.npz`` of float32 arrays (``x_T`` and, when the
    posterior is sampled, ``posterior``; channel-first like the draws): a runtime without torch
    cannot redraw torch's generator, so the case carries the values its expected frames used.
    Plain numeric arrays: read back with ``allow_pickle=False``."""
    arrays = {"x_T": np.ascontiguousarray(x_T, dtype=np.float32)}
    if posterior is not None:
        arrays["posterior"] = np.ascontiguousarray(posterior, dtype=np.float32)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def png_bytes(frame: np.ndarray) -> bytes:
    """One uint8 frame as PNG bytes (a case's input.png and expected.png)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return buf.getvalue()


def frame_summary(frames: np.ndarray) -> dict[str, Any]:
    """sha256 of the uint8 frame bytes (T, H, W, 3) and their statistics."""
    f = np.ascontiguousarray(frames, dtype=np.uint8)
    return {"frames_sha256": hashlib.sha256(f.tobytes()).hexdigest(), "shape": list(f.shape),
            "mean": float(f.mean()), "std": float(f.std()), "min": int(f.min()), "max": int(f.max())}


def package_cases(loaded: Any, fixtures: list[Any], area_of: Any) -> list[PackageCase]:
    """Single-image cases: the PNG, the noise drawn for the seed (``noise.npz``), and the torch
    reference's restored frames (``expected.png``, sha256 and statistics) for the seed and area
    the run verb would use."""
    from ncnnport.models.seedvr2.config import OFFICIAL_SEED
    from ncnnport.models.seedvr2.pipeline import TorchBackend, restore
    from PIL import Image

    ref = loaded.reference
    backend = TorchBackend(ref.dit, ref.vae)
    out = []
    for fx in fixtures:
        png = png_bytes(fx.video()[0])
        with Image.open(io.BytesIO(png)) as im:  # as run reads it (port.decode_image)
            video = np.asarray(im.convert("RGB"), dtype=np.uint8)[None]
        area = area_of(loaded, *video.shape[1:3])
        result = restore(ref.config, backend, video, ref.text.numpy(), seed=OFFICIAL_SEED, area=area)
        files = {"input.png": png, "noise.npz": noise_npz(result.noise.x_T, result.noise.posterior),
                 "expected.png": png_bytes(result.frames[0])}
        out.append(PackageCase(fx.label, files, {"frames": "input.png", "noise": "noise.npz", "expected": "expected.png"},
                               expected={**frame_summary(result.frames), "noise": result.noise.record()},
                               args={"seed": OFFICIAL_SEED, "area": area, "colour_fix": True}))
    return out
