"""SeedVR2 port: hooks the generic stages call (load, split, end-to-end parity, run verb)."""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ncnnport.contract import Tolerance
from ncnnport.models.seedvr2.frames import image_rows, image_stats
from ncnnport.models.seedvr2.tiles import TileSpec, tile_spec, tiled
from ncnnport.parity.records import stage_record
from ncnnport.models.kit import KitPort
from ncnnport.registry import CaseRun, E2EContext, LoadedModel

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
# Tiny presets run user inputs at no more than this many pixels (the real model: 720x1280).
TINY_MAX_AREA = 256 * 448
REAL_AREA = 720 * 1280
# The VAE's spatial factor of every preset (2^(len(block_out_channels) - 1) = 8): what the run
# options are checked against before a config is read; the run re-checks them with its config's.
VAE_SPATIAL_FACTOR = 8


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
# Full-width models (the real preset, a real checkpoint) cost 10^2-10^3 x the tiny preset per
# graph on a CPU (torch alone: 7 s for the 64x96 image, 26 s for the 9-frame clip, 46 s for
# 256x448 at 2 DiT blocks on 2 cores; the ncnn VAE was ~35x slower than torch before its 3-D convs
# were folded into 2-D ones), so their parity runs the one-window image and the clip (3 latent frames: regular and
# shifted TIME windows, text averaged over 3 windows), each at its own size; residency is
# checked on the image.
FULL_WIDTH_FIXTURES = ("image_64x96", "video_9x64x96")
FULL_WIDTH_RESIDENCY_FIXTURE = "image_64x96"
# Call-by-call first-divergence trace and the reduced-precision frame records run on the small
# image (one window; every graph is still called, each DiT block once).
TRACE_FIXTURE = "image_64x96"
PRECISION_FIXTURE = "image_64x96"
# Opt-in VAE tiling (tiles.py) is checked on the 336x336 image: 256 px tiles with 64 px of
# overlap cut it into 2 x 2 tiles (rows and columns [0, 256) and [192, 336); latent [0, 32) and
# [24, 42)), so there are seams on both axes, a corner where four tiles meet and a short last
# tile. Tiny presets only: the fixture is not run at full width.
TILING_FIXTURE = "image_336x336_edge_windows"
TILING_SPEC = TileSpec(256, 64)


def image_files(path: Path) -> list[Path]:
    """The image files an ``--input`` names: the file itself, or a folder's images in name order.
    Problems are one-line ValueErrors naming the path."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file or folder")
    if path.is_dir():
        if path.suffix.lower() in IMAGE_SUFFIXES:
            raise ValueError(f"{path}: is a directory, expected an image file")
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ValueError(f"{path}: folder holds no images ({', '.join(IMAGE_SUFFIXES)})")
        return files
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise ValueError(f"{path}: not an image ({', '.join(IMAGE_SUFFIXES)}); for a video give a folder of its frames")
    return [path]


def decode_image(path: Path) -> np.ndarray:
    """One image -> (H, W, 3) uint8. PIL's decompression-bomb warning is an error here (a
    crafted header can claim gigapixels), like an undecodable file: a ValueError naming it."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
        raise ValueError(f"{path}: refused as a decompression bomb ({e})") from None
    except (OSError, SyntaxError, ValueError) as e:  # PIL.UnidentifiedImageError is an OSError
        raise ValueError(f"{path}: cannot decode as an image ({e})") from None


def read_frames(path: Path) -> np.ndarray:
    """An image file -> (1, H, W, 3) uint8; a folder of images -> (T, H, W, 3) in name order."""
    files = image_files(path)
    frames = [decode_image(f) for f in files]
    if len({f.shape for f in frames}) != 1:
        raise ValueError(f"{path}: frames have different sizes {sorted({f.shape for f in frames})}")
    return np.stack(frames)


def check_output(inp: Path, out: Path) -> None:
    """The run verb's output rule: never write into or over the input, never mix with old files.

    A frames folder is written into a NEW or EMPTY folder (a non-empty one is refused, so old
    frames can never sit next to new ones); an image to an image path that is not a folder."""
    inp, out = Path(inp), Path(out)
    ri, ro = inp.resolve(), out.resolve()
    if ro == ri:
        raise ValueError(f"--output {out} is the --input itself; choose another path")
    if ri in ro.parents:
        raise ValueError(f"--output {out} is inside --input {inp}; choose a folder elsewhere")
    if inp.is_dir():
        if out.exists() and not out.is_dir():
            raise ValueError(f"--output {out}: is a file; a frames input needs an output folder")
        if out.is_dir() and any(out.iterdir()):
            raise ValueError(f"--output {out}: folder is not empty; give a new or empty folder (outputs are never mixed)")
        return
    if out.is_dir():
        raise ValueError(f"--output {out}: is a folder; an image input needs an output image path")
    if out.suffix.lower() not in IMAGE_SUFFIXES:
        raise ValueError(f"--output {out}: not an image path ({', '.join(IMAGE_SUFFIXES)})")


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


def official_record(label: str, official: np.ndarray, ncnn: np.ndarray, tol: Tolerance,
                    geo: dict[str, Any]) -> dict[str, Any]:
    """"ncnn fp32 vs official-as-shipped": the port's frames against the official numerics
    (pipeline.OfficialBackend: bf16 VAE, bf16 attention, autocast). Reported, never gated: the
    fp32 port is judged against the fp32 reference; this says how far the official release's
    own output is from ours. ``would_pass`` is what the frames gate would have said."""
    rec = stage_record(label, "frames:official_as_shipped", image_rows(official), image_rows(ncnn), tol, **geo,
                       **image_stats(official, ncnn), compares="ncnn fp32 vs official-as-shipped")
    rec.update(would_pass=rec["passed"], passed=True, gated=False,
               reason="reported, not gated (official bf16 numerics vs the fp32 port)")
    return rec


def is_block_graph(name: str) -> bool:
    return name.startswith("dit_block_")


def full_width(cfg: Any) -> bool:
    """Whether ``cfg`` has the real model's widths (the real preset, a real checkpoint)."""
    from ncnnport.models.seedvr2.config import REAL

    return cfg.dit.vid_dim >= REAL.dit.vid_dim


def default_area(cfg: Any, h: int, w: int) -> int:
    """Full-size models run at the official 720x1280 area; small test models (presets or
    checkpoints of a tiny config) at the input's own area, capped for CPU time."""
    return REAL_AREA if full_width(cfg) else min(h * w, TINY_MAX_AREA)


def graph_backend_for(cfg: Any, modules: Mapping[str, Any], streamed: bool = False, trig: Any = None,
                      release_stages: bool = False):
    """(backend, runners): the pipeline backend over ``modules`` and the runner lifecycle it
    opens and releases through (``modules`` itself when it is one, the run verb's and the
    parity driver's ``LazyModules``; else a view over the open graphs). Streamed: each DiT
    block graph is opened right before its call and released right after. ``trig``: the RoPE
    and timestep tables' source (default torch's functions; a package's lookup tables).
    ``release_stages``: each pipeline stage's graphs are released when it is done (``--low-memory``)."""
    from ncnnport.models.seedvr2.runner import GraphBackend
    from ncnnport.runtime.lazy_modules import Runners

    runners = modules if isinstance(modules, Runners) else Runners.over(modules)
    release = runners.release if streamed or release_stages else None
    return GraphBackend(cfg, runners.get, release, streamed=streamed, trig=trig,
                        release_stages=release_stages, has=runners.__contains__), runners


def noise_line(noise: Any, source: Path | None) -> str:
    """How the run log names its noise: the file it came from, or the seed and generator."""
    rec = noise.record()
    where = f"noise from {source}" if source is not None else f"noise seed {rec['seed']} on {rec['device']}"
    return f"{where}, posterior {rec['posterior']}, sha256 {rec['sha256'][:16]}"


NUMPY_NOISE_NOTE = ("note: noise drawn with numpy's generator for --seed: not the official torch stream, so frames "
                    "differ from the torch run path's; pass --noise FILE.npz for given values")


# The policy stages its pipelines ask gates for (ModelPort.policy_stages; e2e_measure's --compare too).
POLICY_STAGES = ("latent", "blocks", "vid_out", "decoded", "frames", "residency", "tiling_decode", "tiling_encode")


class SeedVR2Port(KitPort):
    """``tiny``: the built preset (first ``layers`` blocks kept). ``real``: SeedVR2-3B dims with
    seeded per-tensor weights, and a checkpoint folder (safetensors, or official ``.pth`` files
    converted once, see pth.py): both a :class:`~.lazy.LazySeedVR2` whose graphs are built one at
    a time from their own tensors (the whole model is materialised only for e2e parity, the torch
    bench or ``run``)."""

    name = "seedvr2"
    presets = ("tiny", "real")
    policy_stages = POLICY_STAGES

    @property
    def layer_stacks(self):  # declared with the config (model.truncate cuts built models with it)
        from ncnnport.models.seedvr2.config import LAYER_STACKS
        return LAYER_STACKS

    def config_folder(self, preset: str, ckpt: Path | None) -> Path | None:
        """Official .pth weights are converted once into the build folder (pth.py), then loaded
        through the same strict safetensors path as any checkpoint."""
        from ncnnport.models.seedvr2.pth import safetensors_folder
        from ncnnport.paths import DEFAULT_BUILD_ROOT
        return None if ckpt is None else safetensors_folder(ckpt, DEFAULT_BUILD_ROOT)

    def read_config(self, folder: Path | None, preset: str) -> Any:
        from ncnnport.models.seedvr2.config import PRESETS
        from ncnnport.models.seedvr2.folder import read_config
        return PRESETS[preset] if folder is None else read_config(folder)

    def seeded(self, config: Any, seed: int) -> Any:
        from ncnnport.models.seedvr2 import lazy
        return lazy.seeded(config, seed)

    def from_folder(self, folder: Path, config: Any, truncated: bool) -> Any:
        from ncnnport.models.seedvr2 import lazy
        return lazy.from_folder(folder, config, truncated)

    def reference(self, preset: str, ckpt: Path | None, folder: Path | None, config: Any,
                  layers: int | None) -> Any:
        """Small presets are built whole in memory (their seeded init is model-wide), then cut."""
        from ncnnport.models.seedvr2 import model as M
        if ckpt is None and preset not in self.seeded_presets:
            return M.truncate(M.from_preset(preset), layers)
        return super().reference(preset, ckpt, folder, config, layers)

    # --- pipelines -----------------------------------------------------------------------------
    @staticmethod
    def torch_backend(loaded: LoadedModel, device: str = "cpu"):
        from ncnnport.models.seedvr2.pipeline import TorchBackend

        return TorchBackend(loaded.reference.dit, loaded.reference.vae, device)

    @staticmethod
    def official_backend(loaded: LoadedModel):
        from ncnnport.models.seedvr2.pipeline import OfficialBackend

        return OfficialBackend(loaded.reference.dit, loaded.reference.vae)

    @staticmethod
    def graph_backend(loaded: LoadedModel, modules: Mapping[str, Any], streamed: bool = False):
        """:func:`graph_backend_for` the reference's config (torch's RoPE/timestep tables)."""
        return graph_backend_for(loaded.reference.config, modules, streamed)

    @staticmethod
    def _full_width(loaded: LoadedModel) -> bool:
        return full_width(loaded.reference.config)

    def _fixtures(self, loaded: LoadedModel) -> tuple[list[Fixture], str]:
        """The synthetic e2e fixtures for this model's width, and the residency fixture."""
        if self._full_width(loaded):
            return [f for f in FIXTURES if f.label in FULL_WIDTH_FIXTURES], FULL_WIDTH_RESIDENCY_FIXTURE
        return list(FIXTURES), RESIDENCY_FIXTURE

    def _area(self, loaded: LoadedModel, h: int, w: int) -> int:
        """:func:`default_area` of the reference's config."""
        return default_area(loaded.reference.config, h, w)

    # --- end-to-end parity ---------------------------------------------------------------------
    def e2e_parity(self, ctx: E2EContext) -> list[dict[str, Any]]:
        from ncnnport.models.seedvr2.pipeline import restore

        loaded = ctx.loaded
        ref = loaded.reference
        txt = ref.text.numpy()
        policy, prec = ctx.policy, ctx.precision
        frames_tol = policy.stage("frames", prec)
        res_tol = policy.stage("residency", prec)
        fixtures, residency_fixture = self._fixtures(loaded)
        # synthetic fixtures run at their own size (they were sized for the window logic); user
        # inputs at the model's working area (720x1280 at full width)
        cases: list[tuple[str, np.ndarray, int, int]] = [
            (f.label, f.video(), f.seed, f.height * f.width) for f in fixtures]
        for i, p in enumerate(ctx.user_inputs):
            video = read_frames(Path(p))
            cases.append((f"input:{Path(p).name}", video, 100 + i, self._area(loaded, *video.shape[1:3])))
        torch_be = self.torch_backend(loaded)
        ncnn_be, _ = self.graph_backend(loaded, ctx.ncnn_modules)
        official_be = None
        records: list[dict[str, Any]] = []
        for label, video, seed, area in cases:
            # the official draws (posterior sampled, then x_T) shared by every backend
            a = restore(ref.config, torch_be, video, txt, seed=seed, area=area)
            b = restore(ref.config, ncnn_be, video, txt, a.noise, area=area)
            geo = {"frames_in": int(video.shape[0]), "size": list(a.frames.shape[1:3]),
                   "latent_shape": list(a.stages["latent"].shape), "noise": a.noise.record()}
            if label == PRECISION_FIXTURE or not self._full_width(loaded):
                official_be = official_be or self.official_backend(loaded)
                o = restore(ref.config, official_be, video, txt, a.noise, area=area)
                records.append(official_record(label, o.frames, b.frames, frames_tol, geo))
            for stage in ["latent"] + sorted(k for k in a.stages if k.startswith("block_")) + ["vid_out", "decoded"]:
                tol = policy.stage("blocks" if stage.startswith("block_") else stage, prec)
                records.append(stage_record(label, stage, a.stages[stage], b.stages[stage], tol, **geo))
            records.append(stage_record(label, "frames", image_rows(a.frames), image_rows(b.frames),
                                        frames_tol, **geo, **image_stats(a.frames, b.frames)))
            if label == residency_fixture:
                streamed_be, runners = self.graph_backend(loaded, ctx.ncnn_modules, streamed=True)
                runners.release_all(is_block_graph)   # the streamed run loads every block graph itself
                loads_before = runners.opened(is_block_graph)
                c = restore(ref.config, streamed_be, video, txt, a.noise, area=area)
                block_loads = runners.opened(is_block_graph) - loads_before
                identical = bool(np.array_equal(b.frames, c.frames)) and all(
                    np.array_equal(b.stages[k], c.stages[k]) for k in b.stages if k.startswith("block_"))
                records.append(stage_record(label, "residency", image_rows(b.frames),
                                            image_rows(c.frames), res_tol, **geo,
                                            residency="streamed vs resident", block_loads=block_loads,
                                            byte_identical=identical, **image_stats(b.frames, c.frames)))
                if not identical:
                    records[-1]["passed"] = False
                    records[-1]["reason"] = "streamed blocks differ from resident blocks"
            if label == TRACE_FIXTURE and ctx.torch_modules:
                records.append(self._trace(label, video, seed, area, ctx))
            if label == PRECISION_FIXTURE and prec == "fp32":
                records += self._precision_records(ctx, label, video, seed, area, a.frames, b.frames, geo)
            if label == TILING_FIXTURE:
                records += self._tiling_records(ctx, label, video, area, a, ncnn_be, geo)
        return records

    def _tiling_records(self, ctx: E2EContext, label: str, video: np.ndarray, area: int, untiled: Any,
                        ncnn_be: Any, geo: dict[str, Any]) -> list[dict[str, Any]]:
        """The opt-in VAE tiling (:data:`TILING_SPEC`), with the untiled run's noise.

        What the rule itself changes, torch tiled vs torch untiled on the same inputs: the VAE
        decode of the untiled run's latent and the encoder's posterior mean, each judged by its
        ``tiling_*`` budget (fp32 in every mode: torch against torch) on the GLOBAL cosine (the
        tensors flattened to one row: a per-row cosine would judge the worst seam row of seeded
        weights), and the end-to-end frames, reported (they compound both halves and the DiT).
        Then ncnn tiled vs torch tiled, judged by the mode's own stage budgets, as untiled."""
        from ncnnport.models.seedvr2.pipeline import restore
        from ncnnport.models.seedvr2.tiles import TiledVAE

        ref = ctx.loaded.reference
        txt, f = ref.text.numpy(), ref.config.vae.spatial_factor
        torch_be = self.torch_backend(ctx.loaded)
        torch_tiled = TiledVAE(torch_be, TILING_SPEC, f)
        extra = {**geo, "vae_tile": TILING_SPEC.tile, "vae_overlap": TILING_SPEC.overlap,
                 "compares": "torch tiled vs torch untiled"}
        x = untiled.stages["input"][None]
        # what the untiled run's decoder got (host.restore: x0 / scaling factor, channel-first)
        z = np.ascontiguousarray((untiled.stages["x0"] / ref.config.vae.scaling_factor).transpose(3, 0, 1, 2)[None],
                                 dtype=np.float32)
        pol, prec = ctx.policy, ctx.precision
        recs = [stage_record(label, "tiling:decode", _one_row(untiled.stages["decoded"]), _one_row(torch_tiled.decode(z)),
                             pol.stage("tiling_decode", "fp32"), **extra),
                stage_record(label, "tiling:encode", _one_row(untiled.stages["posterior_mean"]),
                             _one_row(torch_tiled.encode(x)[0]), pol.stage("tiling_encode", "fp32"), **extra)]
        t = restore(ref.config, torch_tiled, video, txt, untiled.noise, area=area)
        rec = stage_record(label, "tiling:frames", image_rows(untiled.frames), image_rows(t.frames),
                           pol.stage("frames", "fp32"), **extra, **image_stats(untiled.frames, t.frames))
        rec.update(would_pass=rec["passed"], passed=True, gated=False,
                   reason="reported, not gated (the tiled pipeline is not the official one; see tiling:decode/encode)")
        recs.append(rec)
        n = restore(ref.config, TiledVAE(ncnn_be, TILING_SPEC, f), video, txt, untiled.noise, area=area)
        extra["compares"] = "ncnn tiled vs torch tiled"
        for stage in ("latent", "decoded"):
            recs.append(stage_record(label, f"tiled:{stage}", t.stages[stage], n.stages[stage], pol.stage(stage, prec),
                                     **extra))
        recs.append(stage_record(label, "tiled:frames", image_rows(t.frames), image_rows(n.frames),
                                 pol.stage("frames", prec), **extra, **image_stats(t.frames, n.frames)))
        return recs

    def streamed_parity(self, ctx: E2EContext) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Full-depth parity with one module of each side resident (``parity --stream``, see
        streamed.py) on the one-window image, and on ``--input`` images at their own size."""
        from ncnnport.models.seedvr2.streamed import streamed_parity

        policy = ctx.policy
        local_tol = policy.default("fp32")

        def tol_for(stage: str) -> Tolerance:
            return policy.stage(stage, "fp32")

        cases = [(f.label, f.video(), f.seed) for f in FIXTURES if f.label == TRACE_FIXTURE]
        cases += [(f"input:{Path(p).name}", read_frames(Path(p)), 100 + i) for i, p in enumerate(ctx.user_inputs)]
        records: list[dict[str, Any]] = []
        receipts: dict[str, Any] = {}
        for label, video, seed in cases:
            recs, receipts[label] = streamed_parity(ctx.loaded.reference, ctx.ncnn_modules, label, video, seed,
                                                    video.shape[1] * video.shape[2], tol_for, local_tol)
            records += recs
        return records, receipts

    def _trace(self, label: str, video: np.ndarray, seed: int, area: int, ctx: E2EContext) -> dict[str, Any]:
        """Call-by-call first-divergence trace: the pipeline on the torch wrappers vs on ncnn."""
        from ncnnport.models.seedvr2.pipeline import restore
        from ncnnport.models.seedvr2.runner import GraphBackend
        from ncnnport.parity.trace import first_divergence, trace_gates

        ref = ctx.loaded.reference
        txt = ref.text.numpy()

        def pipeline_run(modules: Mapping[str, Any]) -> None:
            restore(ref.config, GraphBackend(ref.config, modules.__getitem__, has=modules.__contains__),
                    video, txt, seed=seed, area=area)

        return first_divergence(label, pipeline_run, ctx.torch_modules, ctx.ncnn_modules,
                                **trace_gates(ctx.policy, ctx.precision, list(ctx.ncnn_modules)),
                                keep_dir=ctx.package_dir.parent / "trace",
                                gate=ctx.policy.trace_gate(ctx.precision))

    def _precision_records(self, ctx: E2EContext, label: str, video: np.ndarray, seed: int, area: int,
                           ref_frames: np.ndarray, fp32_frames: np.ndarray,
                           geo: dict[str, Any]) -> list[dict[str, Any]]:
        """End-to-end uint8 frames under every reduced-precision option of the sweep (ncnn
        fp16/bf16 storage, fp16 arithmetic; pnnx fp16 weights when that package was built),
        each vs the torch fp32 frames and vs the ncnn fp32 frames, judged by the frames gate of
        the option's own precision mode. The option sweep keeps one worst number per option;
        these records keep the frame metrics (MAE, PSNR, max diff, differing bytes) per option."""
        from ncnnport.package.manifest import check_package
        from ncnnport.models.seedvr2.pipeline import restore
        from ncnnport.parity.sweep import variants
        from ncnnport.runtime import precision
        from ncnnport.runtime.lazy_modules import LazyModules

        ref = ctx.loaded.reference
        out = []
        for v in variants(gpu=False):
            if v.precision == "fp32":
                continue
            pkg = ctx.package_dir.with_name(precision.get(v.setting).package_name)
            if pkg != ctx.package_dir:  # pnnx fp16 or int8 weights: their own package
                if check_package(pkg):
                    continue  # not converted yet: the sweep converts it and measures it there
            mods = LazyModules(pkg, options=v.options)
            be, _ = self.graph_backend(ctx.loaded, mods)
            c = restore(ref.config, be, video, ref.text.numpy(), seed=seed, area=area)
            tol = ctx.policy.stage("frames", v.precision)
            out.append(stage_record(label, f"precision:{v.name}", image_rows(ref_frames), image_rows(c.frames),
                                    tol, **geo, precision_mode=v.precision, options=v.options.to_json(),
                                    fp16_weights=v.fp16_weights, **image_stats(ref_frames, c.frames),
                                    vs_ncnn_fp32=image_stats(fp32_frames, c.frames)))
            mods.release_all()
        return out

    # --- bench (models/seedvr2/bench.py; tables, torch_call and bytes through the kit) ----------------
    def bench_call(self, loaded: LoadedModel, modules: Mapping[str, Any], stage: str, size: str) -> Any:
        """Sizes are pixel HxW of a single image (T = 1). ``dit_block`` is DiT block 0: pre
        graph, every window's attention, post graph; ``dit`` is the whole DiT."""
        from ncnnport.models.seedvr2.bench import ncnn_call

        return ncnn_call(loaded.reference, self.graph_backend(loaded, modules)[0], stage, size)

    # --- run verb ------------------------------------------------------------------------------
    def add_run_arguments(self, parser) -> None:
        from ncnnport.models.seedvr2.config import OFFICIAL_SEED

        parser.add_argument("--input", type=Path, required=True, help="an image file, or a folder of frames")
        parser.add_argument("--output", type=Path, required=True,
                            help="output image path (image input) or a NEW or EMPTY folder (frames input; a "
                                 "non-empty folder is refused so old and new frames never mix); never the input "
                                 "or inside it")
        parser.add_argument("--area", type=int, default=None,
                            help="target pixel area (default: 720*1280 for the full-size model, the "
                                 f"input's own area capped at {TINY_MAX_AREA} for small test configs)")
        parser.add_argument("--seed", type=int, default=OFFICIAL_SEED,
                            help="the official script's seed (default %(default)s, its default): posterior noise "
                                 "then x_T, bf16, in its order and layout")
        parser.add_argument("--noise-device", choices=("cpu", "cuda"), default="cpu",
                            help="generator for the seeded noise: cuda draws what the official (CUDA) run draws on "
                                 "the same GPU model; cpu (default) has the same order, shapes and dtype but "
                                 "torch's CPU generator, so different values (with --package: numpy's generator, "
                                 "another stream again)")
        parser.add_argument("--noise", type=Path, default=None, metavar="FILE.npz",
                            help="explicit noise instead of --seed draws: float32 'x_T' and optionally 'posterior', "
                                 "channel-first (16, t, h, w), e.g. a package case's noise.npz")
        parser.add_argument("--posterior", choices=("sample", "mean"), default="sample",
                            help="sample the VAE posterior like the official encoder (default), or use its mean")
        parser.add_argument("--residency", choices=("resident", "streamed"), default="resident",
                            help="streamed: load, run and release each DiT block's graphs in turn")
        parser.add_argument("--no-colour-fix", action="store_true")
        parser.add_argument("--vae-tile", type=int, default=None, metavar="PX",
                            help="run the VAE encoder and decoder on overlapping PX x PX tiles, blended "
                                 "linearly (bounds their memory by one tile, for 720p/1080p on a 24 GB machine); "
                                 "opt-in: the official pipeline does not tile, so frames differ from the untiled "
                                 "ones (see models/seedvr2/tiles.py); a multiple of 8")
        parser.add_argument("--vae-overlap", type=int, default=None, metavar="PX",
                            help="overlap of neighbouring VAE tiles (default: a quarter of --vae-tile, rounded "
                                 "down to a multiple of 8; at most half the tile)")

    def validate_inputs(self, paths) -> None:
        """Every ``parity --input`` decodes to frames of one size (see :func:`read_frames`)."""
        for p in paths:
            read_frames(Path(p))

    def validate_run_args(self, args) -> None:
        """Input decodes, output follows :func:`check_output`, a ``--noise`` file reads, a CUDA
        noise device exists (never with ``--package``: that path has no torch)."""
        from ncnnport.models.seedvr2.host import read_noise

        self.validate_inputs([args.input])
        check_output(args.input, args.output)
        run_tile_spec(args, VAE_SPATIAL_FACTOR)
        if getattr(args, "noise", None) is not None:
            read_noise(args.noise)
        if getattr(args, "noise_device", "cpu") == "cuda":
            if getattr(args, "package", None) is not None:
                raise ValueError("--noise-device cuda: run --package has no torch; pass the official draws "
                                 "with --noise FILE.npz")
            import torch

            if not torch.cuda.is_available():
                raise ValueError("--noise-device cuda: no CUDA device is visible to torch")

    # --- the C++ runtime (runtime/cpp/apps/seedvr2) ---------------------------------------------
    cpp_executable = "ncnnport-seedvr2"

    def cpp_cases(self, ctx: E2EContext, workdir: Path, max_new_tokens: int) -> list[Any]:
        """The e2e fixtures and ``--input`` files for ``ncnnport-seedvr2`` (``max_new_tokens``
        does not apply to a one-step restorer)."""
        from ncnnport.models.seedvr2 import cpp_cases
        fixtures, _ = self._fixtures(ctx.loaded)
        users = []
        for p in ctx.user_inputs:
            video = read_frames(Path(p))
            users.append((Path(p).resolve(), video, self._area(ctx.loaded, *video.shape[1:3])))
        return cpp_cases.cases(ctx, workdir, fixtures, users, self.torch_backend(ctx.loaded), graph_backend_for)

    def cpp_package_argv(self, package: Path, case: Any, workdir: Path) -> list[str]:
        from ncnnport.models.seedvr2 import cpp_cases
        return cpp_cases.package_argv(package, case, workdir)

    cpp_bench_sizes = (256,)  # bench-cpp's default one square image side
    cpp_bench_kind = "image"
    cpp_bench_torch_devices = ("cpu", "cuda")  # TorchBackend(device=...): numpy in and out, synchronised

    def cpp_bench_cases(self, ctx: Any, sizes: Sequence[int], new_tokens: int) -> Iterator[Any]:
        """``bench-cpp``'s workloads (models/seedvr2/cpp_bench.py, new_tokens unused)."""
        from ncnnport.models.seedvr2 import cpp_bench
        return cpp_bench.cases(ctx, sizes, lambda: self.torch_backend(ctx.loaded, ctx.torch_device), graph_backend_for)

    # --- the package alone (torch-free: packaged.py) -------------------------------------------
    def runtime_description(self, loaded: LoadedModel) -> dict[str, Any]:
        from ncnnport.models.seedvr2.describe import describe
        rule = (f"{REAL_AREA} px (720x1280) at full width" if self._full_width(loaded)
                else f"the input's own area, at most {TINY_MAX_AREA} px")
        return describe(loaded.reference.config, rule)

    def runtime_files(self, loaded: LoadedModel) -> dict[str, bytes]:
        from ncnnport.models.seedvr2.describe import HOST_TABLES, TEXT_EMBEDDING, host_tables_npz, npy_bytes
        cfg = loaded.reference.config
        return {TEXT_EMBEDDING: npy_bytes(loaded.reference.text.numpy().astype(np.float32)),
                HOST_TABLES: host_tables_npz(cfg)}

    def package_cases(self, loaded: LoadedModel) -> list[Any]:
        from ncnnport.models.seedvr2.describe import package_cases
        single = [f for f in self._fixtures(loaded)[0] if f.frames == 1][:2]
        return package_cases(loaded, single, self._area)

    def run_case(self, package: Path, model_json: Mapping[str, Any], case: Any,
                 modules: Mapping[str, Any]) -> CaseRun:
        """A packaged case with its stored noise on the package's numpy host flow."""
        from ncnnport.models.seedvr2 import packaged

        rt = packaged.open_packaged(package, model_json)
        backend, _ = graph_backend_for(rt.cfg, modules, trig=rt.trig)
        return packaged.run_case(rt, backend, case, read_frames(case.inputs["frames"]))

    def check_case(self, package: Path, model_json: Mapping[str, Any], case: Any,
                   modules: Mapping[str, Any]) -> dict[str, Any]:
        """A packaged case with its stored noise against its expected frames: equal bytes, or the
        packaged policy's frames gate of the run's judging mode against ``expected.png`` (ncnn's
        graphs are not torch's bit for bit, so a few values can land one level off)."""
        from ncnnport.models.seedvr2 import packaged
        from ncnnport.parity.policy import Policy
        from ncnnport.runtime import precision

        options = _options_of(modules)
        mode = precision.judging_mode(precision.of_options(options), options.use_vulkan)
        policy_file = Path(package) / "policy.json"
        tol = Policy.load(policy_file, stages=self.policy_stages).stage("frames", mode) if policy_file.is_file() else None
        try:  # a package or case this runtime cannot read is a failed row naming the file
            expected = read_frames(case.inputs["expected"]) if "expected" in case.inputs and tol is not None else None
            run = self.run_case(package, model_json, case, modules)
            return packaged.compare_case(run, case.expected, expected, tol)
        except ValueError as exc:  # PackageError is a ValueError
            return {"passed": False, "detail": str(exc)}

    def run(self, loaded: LoadedModel, modules, args) -> int:
        """The run verb on a model build: torch's host ops, the official seeded draws (or ``--noise``)."""
        from ncnnport.models.seedvr2.pipeline import restore

        def flow(backend: Any, video: np.ndarray, noise: Any, area: int) -> Any:
            return restore(loaded.reference.config, backend, video, loaded.reference.text.numpy(), noise,
                           area=area, colour_fix=not args.no_colour_fix)

        cfg = loaded.reference.config
        return self._run_flow(cfg, modules, args, None, flow, lambda shape: self._run_noise(shape, args))

    def run_package(self, package: Path, model_json: Mapping[str, Any], modules: Mapping[str, Any], args: Any) -> int:
        """The run verb on a package alone: numpy host ops, the package's tables and text
        embedding; noise from ``--noise`` or numpy's generator (said in one line)."""
        from ncnnport.models.seedvr2 import host, packaged

        rt = packaged.open_packaged(package, model_json)

        def flow(backend: Any, video: np.ndarray, noise: Any, area: int) -> Any:
            return packaged.restore(rt, backend, video, noise, area, colour_fix=not args.no_colour_fix)

        def noise_for(shape: tuple[int, int, int, int]) -> Any:
            if args.noise is not None:
                return host.read_noise(args.noise, shape)
            print(NUMPY_NOISE_NOTE, file=sys.stderr)
            return host.numpy_noise(shape, args.seed, sample_posterior=args.posterior == "sample")

        return self._run_flow(rt.cfg, modules, args, rt.trig, flow, noise_for)

    @staticmethod
    def _run_flow(cfg: Any, modules: Mapping[str, Any], args: Any, trig: Any, flow: Any, noise_for: Any) -> int:
        """Read the input, restore it with ``flow`` and write the frames: the one run path of the
        model build and of the package (they differ in ``flow``, ``trig`` and ``noise_for``)."""
        from ncnnport.models.seedvr2.host import latent_shape_for

        check_output(args.input, args.output)
        precision = _options_of(modules).label  # the CLI's --precision, applied when it opened them
        video = read_frames(args.input)
        area = args.area or default_area(cfg, video.shape[1], video.shape[2])
        backend, runners = graph_backend_for(cfg, modules, streamed=args.residency == "streamed", trig=trig,
                                             release_stages=_options_of(modules).low_memory)
        spec = run_tile_spec(args, cfg.vae.spatial_factor)
        if spec is not None:
            print(f"note: {spec.describe()}", file=sys.stderr)
        backend = tiled(backend, spec, cfg.vae.spatial_factor)
        noise = noise_for(latent_shape_for(cfg, video, area))
        result = flow(backend, video, noise, area)
        paths = write_frames(result.frames, args.output, single=not Path(args.input).is_dir())
        held = runners.live_peak(is_block_graph)
        print(f"wrote {len(paths)} frame(s) {result.frames.shape[2]}x{result.frames.shape[1]} to {args.output} "
              f"[{precision}, {args.residency}: at most {held} DiT block graph(s) held at once; "
              f"{noise_line(noise, args.noise)}]")
        sys.stdout.flush()
        return 0

    @staticmethod
    def _run_noise(shape: tuple[int, int, int, int], args: Any) -> Any:
        """``--noise FILE.npz``, else the seeded official draws for this input's latent shape
        (``--seed``, ``--noise-device``, ``--posterior``)."""
        from ncnnport.models.seedvr2.host import read_noise
        from ncnnport.models.seedvr2.pipeline import Noise

        if getattr(args, "noise", None) is not None:
            return read_noise(args.noise, shape)
        return Noise.seeded(shape, args.seed, sample_posterior=args.posterior == "sample",
                            device=getattr(args, "noise_device", "cpu"))


def run_tile_spec(args: Any, factor: int) -> TileSpec | None:
    """``--vae-tile`` / ``--vae-overlap`` of a run as a tile spec (None: untiled); a bad value
    is one ValueError line naming the option."""
    return tile_spec(getattr(args, "vae_tile", None), getattr(args, "vae_overlap", None), factor)


def _one_row(a: np.ndarray) -> np.ndarray:
    """``a`` flattened to one row: the worst-row cosine of the comparison is the global one."""
    return np.ascontiguousarray(a, dtype=np.float32).reshape(1, -1)


def _options_of(modules: Mapping[str, Any]) -> Any:
    """The runtime options a mapping of graphs was opened with (a lazy mapping or open graphs)."""
    if hasattr(modules, "options"):
        return modules.options
    return next(iter(modules.values())).options


PORT = SeedVR2Port()
