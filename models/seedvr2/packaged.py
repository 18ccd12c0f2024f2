"""SeedVR2 from its package alone: graphs, ``model.json`` (the strict config), the text
embedding and the host tables; neither torch nor transformers is imported
(``ncnnport run seedvr2 --package``, ``ncnnport verify``).

The flow is ``host.restore`` with the numpy host ops: the colour fix is bit-exact with the torch
path in float32, and so is the resize when upscaling; a downscale is within 2 float32 ulp of
ATen's (so a frame value can land one level off). Cases are judged against their expected
frames (the torch reference's; a derived package's own, see ``package.cases.pin_case``): bytes
first, else the packaged policy's frames gate. RoPE and timestep tables are torch's own values, looked up
(``host_numpy.TrigTables``). Noise comes from an ``.npz`` (the cases carry theirs) or from numpy's
generator, which is not the official torch stream (said in one line by the caller).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ncnnport.models.seedvr2 import host
from ncnnport.models.seedvr2.config import SeedVR2Config
from ncnnport.models.seedvr2.describe import frame_summary
from ncnnport.models.seedvr2.frames import image_rows, image_stats
from ncnnport.models.seedvr2.host_numpy import TrigTables
from ncnnport.package.model_json import PackageError


@dataclass(frozen=True)
class PackagedSeedVR2:
    """A package opened for restoration: its config, positive text embedding and host tables."""

    cfg: SeedVR2Config
    text: np.ndarray
    trig: TrigTables


def _file(package: Path, model_json: Mapping[str, Any], role: str) -> Path:
    path = Path(package) / "model.json"
    rel = (model_json.get("files") or {}).get(role)
    if not isinstance(rel, str):
        raise PackageError(f"{path}: field 'files.{role}' missing (package built before the torch-free "
                           "SeedVR2 runtime; rebuild it with `ncnnport convert`)")
    return Path(package) / rel


def read_host_tables(path: Path, timestep: float) -> TrigTables:
    """``assets/host_tables.npz``: float32 ``rope_cos``/``rope_sin`` [positions, F] and
    ``sinusoid`` [dim] at ``timestep``, read without pickle."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: np.asarray(z[k]) for k in z.files}
    except (OSError, ValueError) as exc:
        raise PackageError(f"{path}: not a readable .npz ({exc})") from None
    missing = sorted({"rope_cos", "rope_sin", "sinusoid"} - set(arrays))
    if missing:
        raise PackageError(f"{path}: arrays {missing} missing")
    try:
        return TrigTables(arrays["rope_cos"], arrays["rope_sin"], timestep, arrays["sinusoid"], str(path))
    except ValueError as exc:
        raise PackageError(str(exc)) from None


def open_packaged(package: Path, model_json: Mapping[str, Any]) -> PackagedSeedVR2:
    """The runtime of ``package`` described by its ``model.json``."""
    path = Path(package) / "model.json"
    if not isinstance(model_json.get("config"), Mapping):
        raise PackageError(f"{path}: field 'config' missing or not an object")
    try:
        cfg = SeedVR2Config.from_json(model_json["config"], source=f"{path} field 'config'")
    except (KeyError, TypeError, ValueError) as exc:
        raise PackageError(f"{path}: field 'config': {exc}") from None
    text = np.load(_file(package, model_json, "text_embedding"), allow_pickle=False)
    if text.dtype != np.float32 or text.ndim != 2:
        raise PackageError(f"{_file(package, model_json, 'text_embedding')}: expected a float32 [L, D] array, "
                           f"got {text.dtype} {list(text.shape)}")
    trig = read_host_tables(_file(package, model_json, "host_tables"), cfg.timestep)
    return PackagedSeedVR2(cfg, text, trig)


def restore(rt: PackagedSeedVR2, backend: Any, video: np.ndarray, noise: host.Noise, area: int,
            colour_fix: bool = True) -> host.Result:
    """``host.restore`` with the numpy host ops on the package's text embedding."""
    return host.restore(rt.cfg, backend, video, rt.text, noise, area=area, colour_fix=colour_fix)


def judge_frames(got: np.ndarray, want: np.ndarray, tol: Any) -> tuple[bool, str]:
    """Frames against the reference's: equal bytes pass; otherwise the frames gate (cosine over
    image rows, max level difference) decides, with the measured difference in the detail."""
    from ncnnport.metrics import compare, judge

    if got.shape != want.shape:
        return False, f"frames {list(got.shape)}, reference {list(want.shape)}"
    if np.array_equal(got, want):
        return True, f"frames bytes equal (sha256 {frame_summary(got)['frames_sha256'][:16]})"
    stats = image_stats(want, got)
    ok, why = judge(compare(image_rows(want), image_rows(got), what="frames"), tol)
    return ok, (f"frames differ in {stats['differing_bytes']} of {stats['total_bytes']} bytes, max "
                f"{stats['image_max_abs']} level(s), PSNR {stats['psnr_db']:.1f} dB; frames gate: {why or 'pass'}")


def run_case(rt: PackagedSeedVR2, backend: Any, case: Any, video: np.ndarray) -> Any:
    """One packaged case on ``backend`` with its stored noise, in the schema of ``case.expected``
    (frame sha256 and statistics; the noise's identity, an input, kept as the case states it), the
    first frame as ``expected.png`` and the frames themselves for the comparison."""
    from ncnnport.models.seedvr2.describe import png_bytes
    from ncnnport.registry import CaseRun

    noise = host.read_noise(case.inputs["noise"])
    result = restore(rt, backend, video, noise, int(case.args["area"]), bool(case.args.get("colour_fix", True)))
    expected = {**frame_summary(result.frames), **({"noise": case.expected["noise"]} if "noise" in case.expected else {})}
    return CaseRun(expected, {"expected.png": png_bytes(result.frames[0])}, output=result.frames)


def compare_case(got: Any, want: Mapping[str, Any], expected: np.ndarray | None, tol: Any) -> dict[str, Any]:
    """A case's run (``run_case``) against its expected values: bytes equal to the expected
    frames' sha256, or (``expected`` frames given) within the frames gate ``tol``."""
    sha = got.expected["frames_sha256"]
    if sha == want["frames_sha256"]:
        return {"passed": True, "detail": f"frames bytes equal (sha256 {sha[:16]})"}
    if expected is None:
        return {"passed": False, "detail": f"frames sha256 {sha[:16]}, reference "
                                           f"{want['frames_sha256'][:16]} (no expected frames to judge by)"}
    ok, detail = judge_frames(got.output, expected, tol)
    return {"passed": ok, "detail": detail}

