"""SeedVR2 port: hooks the generic stages call (load, split, end-to-end parity, run verb)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ncnnport.contract import Tolerance
from ncnnport.parity.records import stage_record
from ncnnport.registry import E2EContext, LoadedModel, ModelPort

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
# Tiny presets run user inputs at no more than this many pixels (the real model: 720x1280).
TINY_MAX_AREA = 256 * 448
REAL_AREA = 720 * 1280


@dataclass(frozen=True)
class Fixture:
    """A seeded synthetic input: smooth gradients plus noise, so every VAE stage sees structure."""

    label: str
    frames: int
    height: int
    width: int
    seed: int

    def video(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        t, y, x = np.meshgrid(np.arange(self.frames), np.linspace(0, 1, self.height),
                              np.linspace(0, 1, self.width), indexing="ij")
        base = np.stack([0.5 + 0.4 * np.sin(6 * x + t * 0.3), 0.5 + 0.4 * np.cos(5 * y - t * 0.2),
                         0.5 + 0.3 * np.sin(4 * (x + y))], axis=-1)
        noisy = base + 0.08 * rng.standard_normal(base.shape)
        return np.clip(np.rint(noisy * 255), 0, 255).astype(np.uint8)


# Resolutions chosen for the window logic: 64x96 is one window; 256x448 (16x28 patched grid)
# has 4 regular windows with 1-token edge windows and 4 shifted windows of 7/9 x 13/15;
# 336x336 (21x21) has 20/1 regular and 10/11 shifted intervals; the 9-frame clip gives 3 latent
# frames, so time is windowed too (3 regular / 3 shifted time windows).
FIXTURES = (
    Fixture("image_64x96", 1, 64, 96, 11),
    Fixture("image_256x448_multiwindow", 1, 256, 448, 12),
    Fixture("image_336x336_edge_windows", 1, 336, 336, 13),
    Fixture("video_9x64x96", 9, 64, 96, 14),
)
RESIDENCY_FIXTURE = "image_256x448_multiwindow"


def read_frames(path: Path) -> np.ndarray:
    """An image file -> (1, H, W, 3) uint8; a folder of images -> (T, H, W, 3) in name order."""
    from PIL import Image

    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"{path}: no images ({', '.join(IMAGE_SUFFIXES)})")
    frames = [np.asarray(Image.open(f).convert("RGB"), dtype=np.uint8) for f in files]
    if len({f.shape for f in frames}) != 1:
        raise ValueError(f"{path}: frames have different sizes {sorted({f.shape for f in frames})}")
    return np.stack(frames)


def write_frames(frames: np.ndarray, out: Path, single: bool) -> list[Path]:
    from PIL import Image

    out = Path(out)
    if single:
        out.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(frames[0]).save(out)
        return [out]
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, f in enumerate(frames):
        p = out / f"frame_{i:05d}.png"
        Image.fromarray(f).save(p)
        paths.append(p)
    return paths


def image_rows(frames: np.ndarray) -> np.ndarray:
    """uint8 (T, H, W, 3) -> float32 (T*H, W*3): the worst-row cosine then runs over image rows,
    not over single RGB triplets (one pixel 1 level off on a black pixel is cosine 0 there)."""
    t, h, w, c = frames.shape
    return frames.reshape(t * h, w * c).astype(np.float32)


def psnr(ref: np.ndarray, cand: np.ndarray) -> float:
    mse = float(np.mean((ref.astype(np.float64) - cand.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else float(10.0 * np.log10(255.0 ** 2 / mse))


def image_stats(ref: np.ndarray, cand: np.ndarray) -> dict[str, Any]:
    d = np.abs(ref.astype(np.int16) - cand.astype(np.int16))
    return {"image_max_abs": int(d.max()), "image_mae": float(d.mean()), "psnr_db": psnr(ref, cand),
            "differing_bytes": int((d > 0).sum()), "total_bytes": int(d.size)}


def spec_json(module: Any) -> dict[str, Any]:
    """The spec record an NcnnModule was opened with (enough to reopen it)."""
    def t(x):
        return {"name": x.name, "shape": list(x.shape), "dtype": x.dtype}
    return {"name": module.name, "inputs": [t(x) for x in module.inputs], "outputs": [t(x) for x in module.outputs]}


class StreamedModules:
    """DiT block graphs loaded right before use and released right after (one block resident)."""

    def __init__(self, modules: Mapping[str, Any]) -> None:
        self.modules = modules
        self.live: dict[str, Any] = {}
        self.loads = 0

    def get(self, name: str) -> Any:
        if not name.startswith("dit_block_"):
            return self.modules[name]
        if name not in self.live:
            from ncnnport.runtime.session import NcnnModule

            src = self.modules[name]
            self.live[name] = NcnnModule(src.param, src.weights, spec_json(src), src.options)
            self.loads += 1
        return self.live[name]

    def release(self, name: str) -> None:
        self.live.pop(name, None)


class SeedVR2Port(ModelPort):
    name = "seedvr2"
    presets = ("tiny",)

    # --- load / split --------------------------------------------------------------------------
    def load(self, preset: str, ckpt: Path | None) -> LoadedModel:
        import torch

        from ncnnport.models.seedvr2 import model as M
        from ncnnport.models.seedvr2.mmrope import rope_freqs

        torch.set_num_threads(1)
        ref = M.load(ckpt) if ckpt is not None else M.from_preset(preset)
        d = ref.config.dit
        want = rope_freqs(d.rope_axis_dim, d.rope_theta)
        for i, blk in enumerate(ref.dit.blocks):
            if not torch.allclose(blk.attn.rope.rope.freqs.float(), want, rtol=0, atol=1e-7):
                raise ValueError(f"blocks.{i}.attn.rope.rope.freqs differ from 1/theta^(2i/d): the host "
                                 "RoPE tables are computed from the config")
        return LoadedModel(name=self.name, preset=preset, ckpt=ckpt, config=ref.config.to_json(), reference=ref)

    def module_specs(self, loaded: LoadedModel):
        from ncnnport.models.seedvr2.specs import module_specs

        return module_specs(loaded.reference)

    # --- pipelines -----------------------------------------------------------------------------
    @staticmethod
    def torch_backend(loaded: LoadedModel):
        from ncnnport.models.seedvr2.pipeline import TorchBackend

        return TorchBackend(loaded.reference.dit, loaded.reference.vae)

    @staticmethod
    def graph_backend(loaded: LoadedModel, modules: Mapping[str, Any], streamed: bool = False):
        from ncnnport.models.seedvr2.runner import GraphBackend

        cfg = loaded.reference.config
        if streamed:
            s = StreamedModules(modules)
            return GraphBackend(cfg, s.get, s.release, streamed=True), s
        return GraphBackend(cfg, modules.__getitem__), None

    def _area(self, loaded: LoadedModel, h: int, w: int) -> int:
        """Full-size models run at the official 720x1280 area; small test models (presets or
        checkpoints of a tiny config) at the input's own area, capped for CPU time."""
        from ncnnport.models.seedvr2.config import REAL

        if loaded.reference.config.dit.vid_dim >= REAL.dit.vid_dim:
            return REAL_AREA
        return min(h * w, TINY_MAX_AREA)

    # --- end-to-end parity ---------------------------------------------------------------------
    def e2e_parity(self, ctx: E2EContext) -> list[dict[str, Any]]:
        from ncnnport.models.seedvr2.pipeline import restore

        loaded = ctx.loaded
        ref = loaded.reference
        txt = ref.text.numpy()
        policy, prec = ctx.policy, ctx.precision
        default = policy.default(prec) if policy else Tolerance()
        frames_tol = policy.stage("frames", prec) if policy else Tolerance(0.99999, 0.0, 1.0)
        res_tol = policy.stage("residency", prec) if policy else Tolerance(0.999999, 0.0, 0.0)
        cases: list[tuple[str, np.ndarray, int]] = [(f.label, f.video(), f.seed) for f in FIXTURES]
        for i, p in enumerate(ctx.user_inputs):
            cases.append((f"input:{Path(p).name}", read_frames(Path(p)), 100 + i))
        torch_be = self.torch_backend(loaded)
        ncnn_be, _ = self.graph_backend(loaded, ctx.ncnn_modules)
        records: list[dict[str, Any]] = []
        for label, video, seed in cases:
            area = self._area(loaded, video.shape[1], video.shape[2])
            a = restore(ref.config, torch_be, video, txt, seed=seed, area=area)
            b = restore(ref.config, ncnn_be, video, txt, seed=seed, area=area)
            geo = {"frames_in": int(video.shape[0]), "size": list(a.frames.shape[1:3]),
                   "latent_shape": list(a.stages["latent"].shape)}
            for stage in ["latent"] + sorted(k for k in a.stages if k.startswith("block_")) + ["vid_out", "decoded"]:
                records.append(stage_record(label, stage, a.stages[stage], b.stages[stage], default, **geo))
            records.append(stage_record(label, "frames", image_rows(a.frames), image_rows(b.frames),
                                        frames_tol, **geo, **image_stats(a.frames, b.frames)))
            if label == RESIDENCY_FIXTURE:
                streamed_be, s = self.graph_backend(loaded, ctx.ncnn_modules, streamed=True)
                c = restore(ref.config, streamed_be, video, txt, seed=seed, area=area)
                identical = bool(np.array_equal(b.frames, c.frames)) and all(
                    np.array_equal(b.stages[k], c.stages[k]) for k in b.stages if k.startswith("block_"))
                records.append(stage_record(label, "residency", image_rows(b.frames),
                                            image_rows(c.frames), res_tol, **geo,
                                            residency="streamed vs resident", block_loads=s.loads,
                                            byte_identical=identical, **image_stats(b.frames, c.frames)))
                if not identical:
                    records[-1]["passed"] = False
                    records[-1]["reason"] = "streamed blocks differ from resident blocks"
        return records

    # --- bench ---------------------------------------------------------------------------------
    def bench_stages(self) -> dict[str, list[str]]:
        """Sizes are pixel HxW of a single image (T = 1)."""
        return {"vae_encode": ["64x96", "256x448"], "dit": ["64x96", "256x448"],
                "vae_decode": ["64x96", "256x448"]}

    def _bench_inputs(self, loaded: LoadedModel, size: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cfg = loaded.reference.config
        h, w = (int(v) for v in size.lower().split("x"))
        s = cfg.vae.spatial_factor
        rng = np.random.default_rng(0)
        x = rng.uniform(-1, 1, (1, 3, 1, h, w)).astype(np.float32)
        cond = rng.standard_normal((1, h // s, w // s, cfg.dit.vid_in_channels)).astype(np.float32)
        z = rng.standard_normal((1, cfg.vae.latent_channels, 1, h // s, w // s)).astype(np.float32)
        return x, cond, z

    def _bench(self, loaded: LoadedModel, backend: Any, stage: str, size: str) -> Any:
        if stage not in self.bench_stages():
            raise NotImplementedError(f"model {self.name} has no bench stage {stage!r}")
        x, cond, z = self._bench_inputs(loaded, size)
        txt = loaded.reference.text.numpy()
        t = loaded.reference.config.timestep
        calls = {"vae_encode": lambda: list(backend.encode(x)),
                 "dit": lambda: [backend.dit(cond, txt, t, {})],
                 "vae_decode": lambda: [backend.decode(z)]}
        return calls[stage]

    def bench_call(self, loaded: LoadedModel, modules: Mapping[str, Any], stage: str, size: str) -> Any:
        return self._bench(loaded, self.graph_backend(loaded, modules)[0], stage, size)

    def torch_bench_call(self, loaded: LoadedModel, stage: str, size: str) -> Any:
        return self._bench(loaded, self.torch_backend(loaded), stage, size)

    # --- run verb ------------------------------------------------------------------------------
    def add_run_arguments(self, parser) -> None:
        parser.add_argument("--input", type=Path, required=True, help="an image file, or a folder of frames")
        parser.add_argument("--output", type=Path, required=True,
                            help="output PNG (image input) or folder (frames input)")
        parser.add_argument("--area", type=int, default=None,
                            help="target pixel area (default: 720*1280 for the full-size model, the "
                                 f"input's own area capped at {TINY_MAX_AREA} for small test configs)")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--residency", choices=("resident", "streamed"), default="resident",
                            help="streamed: load, run and release each DiT block's graphs in turn")
        parser.add_argument("--no-colour-fix", action="store_true")

    def run(self, loaded: LoadedModel, modules, args) -> int:
        from ncnnport.models.seedvr2.pipeline import restore

        video = read_frames(args.input)
        area = args.area or self._area(loaded, video.shape[1], video.shape[2])
        backend, _ = self.graph_backend(loaded, modules, streamed=args.residency == "streamed")
        result = restore(loaded.reference.config, backend, video, loaded.reference.text.numpy(),
                         seed=args.seed, area=area, colour_fix=not args.no_colour_fix)
        paths = write_frames(result.frames, args.output, single=not Path(args.input).is_dir())
        print(f"wrote {len(paths)} frame(s) {result.frames.shape[2]}x{result.frames.shape[1]} to {args.output}")
        sys.stdout.flush()
        return 0


PORT = SeedVR2Port()
