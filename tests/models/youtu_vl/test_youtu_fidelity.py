"""The host pipeline against the official one: loader (EXIF, modes), the uint8 antialiased resize,
the fused normalisation, strict config.json, max positions and the CLI's input checks.

References are computed with the official building blocks available here: transformers'
``load_image``, and torch's ``interpolate`` on a uint8 channels-last tensor, which is exactly
what torchvision's ``resize`` calls for a uint8 image on an AVX2 CPU (``_do_native_uint8_resize_on_cpu``).
"""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from ncnnport.models.youtu_vl.config import YoutuVLConfig, tiny_config
from ncnnport.models.youtu_vl.processor import process_image, resize_normalize, target_size


def load_image(*args, **kwargs):
    from ncnnport.models.youtu_vl.processor import load_image as ours

    return ours(*args, **kwargs)


def resize_uint8(*args):
    from ncnnport.models.youtu_vl.processor import resize_uint8 as ours

    return ours(*args)


# --- loader ------------------------------------------------------------------------------------
def _gradient(h: int, w: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), (xx + yy) % 256], -1).astype(np.uint8)


def _write(tmp_path, name: str) -> "Path":  # noqa: F821
    rgb = _gradient(24, 40)
    path = tmp_path / name
    if name == "exif6.jpg":
        exif = Image.Exif()
        exif[0x0112] = 6  # Orientation: rotate 90 CW to display
        Image.fromarray(rgb).save(path, exif=exif, quality=95)
    elif name == "i16.png":
        Image.fromarray((rgb[..., 0].astype(np.uint16) * 200)).save(path)
    elif name == "palette.png":
        img = Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
        img.save(path, transparency=3)
    elif name == "la.png":
        Image.fromarray(np.stack([rgb[..., 0], rgb[..., 1]], -1), mode="LA").save(path)
    elif name == "rgba.png":
        Image.fromarray(np.concatenate([rgb, rgb[..., :1]], -1), mode="RGBA").save(path)
    elif name == "cmyk.jpg":
        Image.fromarray(rgb).convert("CMYK").save(path, quality=95)
    elif name == "grey.png":
        Image.fromarray(rgb[..., 1]).save(path)
    return path


LOADER_CASES = ["exif6.jpg", "i16.png", "palette.png", "la.png", "rgba.png", "cmyk.jpg", "grey.png"]


@pytest.mark.parametrize("name", LOADER_CASES)
def test_load_image_matches_transformers_load_image(tmp_path, name):
    from transformers.image_utils import load_image as official

    path = _write(tmp_path, name)
    ours = load_image(path, warn_to=io.StringIO())
    want = official(str(path))
    assert ours.mode == "RGB" and ours.size == want.size
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(want))


def test_exif_orientation_is_applied_where_a_plain_convert_is_not(tmp_path):
    path = _write(tmp_path, "exif6.jpg")
    with Image.open(path) as img:
        plain = img.convert("RGB")
    upright = load_image(path)
    assert plain.size == (40, 24) and upright.size == (24, 40)


@pytest.mark.parametrize("name, needle", [("i16.png", "clips"), ("rgba.png", "transparency"),
                                          ("la.png", "transparency"), ("palette.png", "transparency")])
def test_lossy_official_conversions_print_one_warning_line(tmp_path, name, needle):
    out = io.StringIO()
    load_image(_write(tmp_path, name), warn_to=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ") and needle in lines[0]


@pytest.mark.parametrize("name", ["exif6.jpg", "cmyk.jpg", "grey.png"])
def test_faithful_conversions_do_not_warn(tmp_path, name):
    out = io.StringIO()
    load_image(_write(tmp_path, name), warn_to=out)
    assert out.getvalue() == ""


# --- resize -------------------------------------------------------------------------------------
def _torch_uint8_resize(hwc: np.ndarray, size_hw: tuple[int, int]) -> np.ndarray:
    """torchvision's uint8 path: interpolate on the channels-last 1CHW uint8 view of the image."""
    t = torch.from_numpy(np.ascontiguousarray(hwc).copy()).permute(2, 0, 1)[None].contiguous(memory_format=torch.channels_last)
    out = torch.nn.functional.interpolate(t, size=list(size_hw), mode="bilinear",
                                          align_corners=False, antialias=True)
    assert out.dtype == torch.uint8
    return out[0].permute(1, 2, 0).numpy()


RESIZE_SWEEP = [
    ((1, 1), (32, 32)), ((3, 5), (32, 32)), ((37, 53), (64, 96)), ((180, 270), (192, 288)),
    ((33, 2049), (64, 2080)), ((999, 17), (96, 32)), ((401, 803), (32, 64)), ((640, 480), (640, 512)),
    ((512, 512), (256, 256)), ((1000, 700), (320, 224)), ((97, 31), (97, 64)), ((255, 255), (96, 608)),
]


@pytest.mark.parametrize("src, dst", RESIZE_SWEEP)
def test_numpy_resize_is_bit_exact_with_torch_uint8_antialias(src, dst):
    img = np.random.default_rng(src[0] * 7 + src[1]).integers(0, 256, src + (3,), dtype=np.uint8)
    np.testing.assert_array_equal(resize_uint8(img, dst), _torch_uint8_resize(img, dst))


def test_torch_reference_runs_the_uint8_kernel_not_a_float_round_trip():
    """The reference must be the integer kernel: its fixed-point taps differ from float ones."""
    img = np.random.default_rng(1).integers(0, 256, (401, 803, 3), dtype=np.uint8)
    u8 = _torch_uint8_resize(img, (64, 96))
    t = torch.from_numpy(img).permute(2, 0, 1)[None].float()
    f32 = torch.nn.functional.interpolate(t, size=[64, 96], mode="bilinear", align_corners=False,
                                          antialias=True).round().clamp(0, 255).to(torch.uint8)
    assert (f32[0].permute(1, 2, 0).numpy() != u8).any()


def _official_pixel_values(img: Image.Image, cap: int) -> np.ndarray:
    """image_processing_siglip2_fast._preprocess with torch ops: size rule, uint8 resize, fused
    rescale+normalise (mean/std times 1/rescale_factor, float32), merge-block patch order."""
    rgb = np.asarray(img.convert("RGB"))
    h, w = target_size(rgb.shape[0], rgb.shape[1], max_num_patches=cap)
    x = torch.from_numpy(_torch_uint8_resize(rgb, (h, w))).permute(2, 0, 1).to(torch.float32)
    mean = torch.tensor([0.5, 0.5, 0.5]) * (1.0 / 0.00392156862745098)
    std = torch.tensor([0.5, 0.5, 0.5]) * (1.0 / 0.00392156862745098)
    x = (x - mean[:, None, None]) / std[:, None, None]
    gh, gw = h // 16, w // 16
    x = x.reshape(3, gh // 2, 2, 16, gw // 2, 2, 16).permute(1, 4, 2, 5, 3, 6, 0)
    return x.reshape(gh * gw, -1).numpy()


@pytest.mark.parametrize("hw, cap", [((180, 270), 36864), ((700, 900), 400), ((45, 61), 36864)])
def test_pixel_values_equal_the_official_preprocess(hw, cap):
    img = Image.fromarray(np.random.default_rng(hw[0]).integers(0, 256, hw + (3,), dtype=np.uint8))
    cfg = tiny_config()
    got = process_image(img, cfg.vision, cfg.processor, max_num_patches=cap).pixel_values
    np.testing.assert_array_equal(got, _official_pixel_values(img, cap))


def test_normalisation_is_the_fused_float32_formula():
    levels = np.arange(256, dtype=np.uint8)
    img = Image.fromarray(np.stack([np.tile(levels, (32, 1))] * 3, -1))  # 32x256, no resize
    x = resize_normalize(img, (32, 256), tiny_config().processor)
    want = (torch.arange(256, dtype=torch.float32) - 127.5) / 127.5
    np.testing.assert_array_equal(x[0, 0], want.numpy())


# --- config.json --------------------------------------------------------------------------------
def _strip(data: dict, dotted: str) -> dict:
    data = json.loads(json.dumps(data))
    if dotted.startswith("vision_config."):
        del data["vision_config"][dotted.split(".", 1)[1]]
    else:
        del data[dotted]
    return data


# every field the port reads, named as in the official config classes (listed here, not taken
# from the code under test)
REQUIRED_FIELDS = [
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "rope_theta", "max_position_embeddings", "rms_norm_eps", "rope_interleave",
    "vision_config.hidden_size", "vision_config.num_hidden_layers", "vision_config.num_attention_heads",
    "vision_config.intermediate_size", "vision_config.hidden_act", "vision_config.layer_norm_eps",
    "vision_config.patch_size", "vision_config.num_channels", "vision_config.out_hidden_size",
    "bos_token_id", "eos_token_id", "image_token_id", "vision_start_token_id", "vision_end_token_id",
]


@pytest.mark.parametrize("field", REQUIRED_FIELDS)
def test_missing_config_field_is_an_error_naming_field_and_file(field):
    data = _strip(tiny_config().to_json(), field)
    with pytest.raises(ValueError, match=rf"^ck/config\.json: missing field '{field}'"):
        YoutuVLConfig.from_json(data, source="ck/config.json")


def test_rope_theta_may_come_from_rope_parameters_and_tie_from_hf_default():
    data = tiny_config().to_json()
    theta = data.pop("rope_theta")
    data.pop("tie_word_embeddings")
    data["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    cfg = YoutuVLConfig.from_json(data)
    assert cfg.text.rope_theta == theta and cfg.text.tie_word_embeddings is True


def test_modelling_constants_are_the_official_values():
    from ncnnport.models.youtu_vl.config import MODELLING_CONSTANTS

    data = tiny_config().to_json()
    real = YoutuVLConfig().vision
    for name, value in MODELLING_CONSTANTS.items():
        assert getattr(real, name) == value
        data["vision_config"].pop(name)
    data["vision_config"]["num_hidden_layers"] = 27
    assert YoutuVLConfig.from_json(data).vision.fullatt_block_indexes == (7, 15, 23, 26)


def test_read_config_names_the_file(tmp_path):
    from ncnnport.models.youtu_vl.checkpoint import read_config

    (tmp_path / "config.json").write_text(json.dumps(_strip(tiny_config().to_json(), "rms_norm_eps")))
    with pytest.raises(ValueError, match="config.json: missing field 'rms_norm_eps'"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        read_config(tmp_path)


@pytest.mark.parametrize("name", ["tiny", "mid", "real"])
def test_presets_round_trip_through_strict_config_json(name):
    from ncnnport.models.youtu_vl.config import preset_config

    cfg = preset_config(name)
    assert YoutuVLConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg


# --- max positions ------------------------------------------------------------------------------
def test_generation_past_max_positions_is_refused():
    from ncnnport.models.youtu_vl.model import reference_generate
    from ncnnport.models.youtu_vl.pipeline import generate

    cfg = tiny_config()
    limit = cfg.text.max_position_embeddings
    ids = np.zeros(limit - 10, dtype=np.int64)
    with pytest.raises(ValueError, match=r"prompt of 4086 tokens \+ 11 new tokens exceeds .*\(4096"):
        generate({}, cfg, ids, None, 11)
    with pytest.raises(ValueError, match="exceeds the model's max positions"):
        reference_generate(SimpleNamespace(cfg=cfg), ids, None, 11)


# --- CLI input checks ---------------------------------------------------------------------------
def _args(image, **kw):
    base = {"image": image, "max_new_tokens": 8, "max_patches": None}
    base.update(kw)
    return SimpleNamespace(**base)


def _bad_inputs(tmp_path):
    (tmp_path / "dir.png").mkdir()
    (tmp_path / "text.png").write_text("not an image")
    good = tmp_path / "ok.png"
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(good)
    (tmp_path / "cut.png").write_bytes(good.read_bytes()[:2000])  # header intact, pixels cut
    return {"missing.png": "no such file", "dir.png": "is a directory", "text.png": "cannot be decoded",
            "cut.png": "cannot be decoded"}


def test_validate_inputs_refuses_each_bad_file_by_name(tmp_path):
    from ncnnport.models.youtu_vl.port import PORT

    for name, why in _bad_inputs(tmp_path).items():
        with pytest.raises(ValueError, match=rf"^image .*{name}: {why}"):
            PORT.validate_inputs([tmp_path / name])
        with pytest.raises(ValueError, match=rf"^image .*{name}: {why}"):
            PORT.validate_run_args(_args(tmp_path / name))
    PORT.validate_inputs([tmp_path / "ok.png"])
    PORT.validate_run_args(_args(tmp_path / "ok.png"))
    PORT.validate_run_args(_args(None))


def test_decompression_bomb_is_an_error(tmp_path, monkeypatch):
    from ncnnport.models.youtu_vl.port import PORT

    path = tmp_path / "big.png"
    Image.new("RGB", (300, 300)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300 * 300 // 2 + 1)  # warning zone (< 2x)
    with pytest.raises(ValueError, match=r"^image .*big.png: refused as a decompression bomb"):
        PORT.validate_inputs([path])
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # error zone
    with pytest.raises(ValueError, match=r"^image .*big.png: refused as a decompression bomb"):
        PORT.validate_inputs([path])


@pytest.mark.parametrize("kw, option", [({"max_new_tokens": 0}, "--max-new-tokens"),
                                        ({"max_patches": 3}, "--max-patches")])
def test_run_options_out_of_range_are_refused(kw, option):
    from ncnnport.models.youtu_vl.port import PORT

    with pytest.raises(ValueError, match=f"^{option}"):
        PORT.validate_run_args(_args(None, **kw))
