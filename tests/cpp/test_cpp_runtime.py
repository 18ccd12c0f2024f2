"""C++ runtime groundwork (runtime/cpp): the ncnn build cache, the layer list, and ncnnport-cpp.

The executable is built once per session through `make cpp` (the static ncnn comes from the
version + options keyed cache; a cold cache builds it first, which takes many minutes). Its
answers are compared with the Python side: `check` with ncnnport.package.manifest.check_package,
`tokenize` with the `tokenizers` library, id for id and byte for byte.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import ModuleType

import pytest

from tests.cpp.make_targets import run_make

ROOT = Path(__file__).resolve().parents[2]
CPP = ROOT / "runtime" / "cpp"
# NCNNPORT_CPP_EXE runs the tests against another build (e.g. build/cpp-vulkan) without `make cpp`.
EXE = Path(os.environ.get("NCNNPORT_CPP_EXE", ROOT / "build" / "cpp" / "ncnnport-cpp"))
MODELS = ("qwen3-asr", "youtu-vl", "seedvr2")

TEXTS = [
    "hello world", "", " ", "  leading and trailing  ", "tabs\tand\nnewlines\r\n\n  \n",
    "digits 12345 3.14 007 1,000,000", "don't I'LL we've THEY'RE", "中文测试，标点！日本語のテキスト",
    "emoji 🙂👍🏽 family 👨‍👩‍👧", "e\u0301 cafe\u0301 café naïve", "\u00a0nbsp\u2003em\u3000ideographic",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n", "x<|im_end|><|im_end|>y",
    "<|im_start", "Ελληνικά кириллица עברית العربية", "a" * 300, "!!!??? ... --- ***",
]


def build_script() -> ModuleType:
    """runtime/cpp/build_ncnn.py as a module (it is a standalone script, not a package)."""
    spec = importlib.util.spec_from_file_location("build_ncnn", CPP / "build_ncnn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_exe(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """ncnnport-cpp with bytes in and out (text mode would rewrite \\r\\n)."""
    return subprocess.run([str(EXE), *args], input=stdin, capture_output=True, timeout=120, check=False)


@pytest.fixture(scope="session")
def cpp_exe(built_cpp) -> Path:
    return built_cpp(EXE, "NCNNPORT_CPP_EXE")


_PACKAGES: dict[str, Path] = {}


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """model -> its converted tiny package folder, converted on first use in this session."""
    from ncnnport.stages import convert_stage, prepare
    from ncnnport.targets import Target

    def get(model: str) -> Path:
        if model not in _PACKAGES:
            root = tmp_path_factory.mktemp(model)
            _PACKAGES[model] = Path(convert_stage(prepare(Target(model, "tiny", None, root))))
        return _PACKAGES[model]

    return get


# ---------------------------------------------------------------------------------------------
# layer list


def unlisted_layer_types(params: list[Path], listed: list[str]) -> dict[str, list[str]]:
    """Layer type -> param files using it, for every type not in ``listed``."""
    from ncnnport.package.param_file import read_param

    out: dict[str, list[str]] = {}
    for path in params:
        for layer_type in sorted(set(read_param(path).layer_types()) - set(listed)):
            out.setdefault(layer_type, []).append(path.name)
    return out


def test_unlisted_layer_types_names_a_new_type(tmp_path):
    param = tmp_path / "g.ncnn.param"
    param.write_text("7767517\n3 3\nInput in0 0 1 in0\nBrandNewLayer op 1 1 in0 a\nReshape r 1 1 a out0\n")
    listed = build_script().read_layer_list()
    assert unlisted_layer_types([param], listed) == {"BrandNewLayer": ["g.ncnn.param"]}


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_converted_tiny_package_uses_only_listed_layers(model, converted):
    params = sorted(converted(model).rglob("*.ncnn.param"))
    assert params
    assert unlisted_layer_types(params, build_script().read_layer_list()) == {}, \
        "add these to runtime/cpp/ncnn_layers.txt"


def test_layer_list_file_rejects_a_bad_line(tmp_path):
    bad = tmp_path / "layers.txt"
    bad.write_text("# comment\nConvolution\nnot a name\n")
    b = build_script()
    with pytest.raises(b.BuildError, match=r"layers.txt:3: not a layer type name"):
        b.read_layer_list(bad)


# ---------------------------------------------------------------------------------------------
# ncnn build script: cache key, closure, atomic install


def fake_ncnn_source(root: Path, top_cmake: str) -> Path:
    """A miniature ncnn source tree: four declared layers, internal references between them."""
    src = root / "ncnn-fake"
    (src / "src" / "layer" / "x86").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(top_cmake)
    (src / "src" / "CMakeLists.txt").write_text(
        "ncnn_add_layer(Alpha)\nncnn_add_layer(Beta)\nncnn_add_layer(Gamma OFF)\nncnn_add_layer(Delta)\n"
        "ncnn_add_layer(Unused)\n")
    (src / "src" / "net.cpp").write_text("create_layer_cpu(ncnn::LayerType::Delta);\n")
    (src / "src" / "layer" / "alpha.cpp").write_text("create_layer_cpu(LayerType::Beta);\n")
    (src / "src" / "layer" / "x86" / "beta_x86.cpp").write_text('#include "helper.h"\n')
    (src / "src" / "layer" / "x86" / "helper.h").write_text("LayerType::Gamma\n")
    return src


def test_layer_closure_adds_what_kept_layers_and_core_create(tmp_path):
    b = build_script()
    src = fake_ncnn_source(tmp_path, "")
    assert b.layer_closure(src, ["Alpha"]) == ["Alpha", "Beta", "Delta", "Gamma"]
    args = b.layer_cmake_args(src, ["Alpha", "Beta"])
    assert "-DWITH_LAYER_unused=OFF" in args and "-DWITH_LAYER_alpha=ON" in args
    with pytest.raises(b.BuildError, match="not ncnn .* layer types: Nope"):
        b.layer_closure(src, ["Alpha", "Nope"])


def test_cache_folder_is_keyed_by_every_option():
    b = build_script()
    base = b.build_options(["Input"], vulkan=False, isa="avx2")
    variants = [b.build_options(["Input", "Gemm"], False, "avx2"), b.build_options(["Input"], True, "avx2"),
                b.build_options(["Input"], False, "all"), b.build_options(["Input"], False, "avx512"),
                {**base, "version": "1.0.0"}]
    names = {b.install_dir(o).name for o in variants} | {b.install_dir(base).name}
    assert len(names) == 6
    assert b.install_dir(b.build_options(["Input"], False, "avx2")) == b.install_dir(base)
    assert b.install_dir(base).name.startswith(f"ncnn-{b.NCNN_VERSION}-")


def _fake_sdist(tmp_path: Path, top_cmake: str) -> Path:
    src = fake_ncnn_source(tmp_path / "unpacked", top_cmake)
    sdist = tmp_path / "fake.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    return sdist


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_failed_build_leaves_no_cache_folder(tmp_path, monkeypatch):
    b = build_script()
    monkeypatch.setenv("NCNNPORT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(b, "fetch_sdist", lambda: _fake_sdist(tmp_path, 'message(FATAL_ERROR "boom")\n'))
    options = b.build_options(["Alpha"], False, "avx2")
    with pytest.raises(b.BuildError, match="cmake .*failed"):
        b.build(options, jobs=1)
    assert not b.install_dir(options).exists()
    assert not list((tmp_path / "cache").glob(".tmp-*"))
    assert not b.cached(b.install_dir(options), options)


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_successful_build_is_renamed_whole_and_then_a_cache_hit(tmp_path, monkeypatch):
    b = build_script()
    monkeypatch.setenv("NCNNPORT_CACHE", str(tmp_path / "cache"))
    project = ("cmake_minimum_required(VERSION 3.18)\nproject(fake NONE)\n"
               'file(WRITE ${CMAKE_BINARY_DIR}/libncnn.a "x")\n'
               "install(FILES ${CMAKE_BINARY_DIR}/libncnn.a DESTINATION lib)\n")
    monkeypatch.setattr(b, "fetch_sdist", lambda: _fake_sdist(tmp_path, project))
    options = b.build_options(["Alpha"], False, "avx2")
    prefix = b.build(options, jobs=1)
    assert prefix == b.install_dir(options) and (prefix / "lib" / "libncnn.a").is_file()
    stamp = json.loads((prefix / b.STAMP).read_text())
    assert stamp["options"] == options and stamp["layers_built"] == ["Alpha", "Beta", "Delta", "Gamma"]
    assert not list((tmp_path / "cache").glob(".tmp-*"))
    assert b.cached(prefix, options)
    assert not b.cached(prefix, {**options, "isa": "all"})


def test_cache_hit_of_the_real_script_takes_seconds(tmp_path):
    """A second `build_ncnn.py` run finds the stamp and prints the same folder (no pip, no cmake)."""
    b = build_script()
    options = b.build_options(b.read_layer_list(), False, b.default_isa("host"))
    if not b.cached(b.install_dir(options), options):
        pytest.skip("ncnn not built yet (make cpp)")
    start = time.monotonic()
    res = subprocess.run([sys.executable, str(CPP / "build_ncnn.py")], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert time.monotonic() - start < 10
    assert "cache hit" in res.stderr and res.stdout.strip() == str(b.install_dir(options))


def test_default_build_holds_the_x86_copies_the_wheel_dispatches_to():
    """ncnn picks a kernel copy per CPU at run time, so a copy the PyPI wheel has and this build
    lacks runs other kernels (other bits) on that CPU: without the AVX512BF16 copy a bf16 run on an
    AVX-512 BF16 CPU took ncnn's generic bf16 path. The default build's Gemm and InnerProduct keep
    every AVX-512 copy (F, VNNI, BF16, FP16) and AVX-VNNI's; only AMD's FMA4 / XOP are left out."""
    b = build_script()
    args = b.build_options(["Input"], False, b.default_isa("host"))["cmake_args"]
    assert {a for a in args if a.startswith(("-DNCNN_AVX", "-DNCNN_FMA4", "-DNCNN_XOP"))} == \
        {"-DNCNN_FMA4=OFF", "-DNCNN_XOP=OFF"}
    options = b.build_options(b.read_layer_list(), False, b.default_isa("host"))
    lib = b.install_dir(options) / "lib" / "libncnn.a"
    if not b.cached(b.install_dir(options), options):
        pytest.skip("ncnn not built yet (make cpp)")
    members = set(subprocess.run(["ar", "t", str(lib)], capture_output=True, text=True, check=True).stdout.split())
    # the copies ncnn 1.0.20261020 has of these two (src/layer/x86): InnerProduct has no VNNI one
    for copy in ("gemm_x86_avx512", "gemm_x86_avx512vnni", "gemm_x86_avx512bf16", "gemm_x86_avxvnni",
                 "innerproduct_x86_avx512", "innerproduct_x86_avx512bf16"):
        assert f"{copy}.cpp.o" in members, copy
    assert not any(m.endswith(("_fma4.cpp.o", "_xop.cpp.o")) for m in members)


# ---------------------------------------------------------------------------------------------
# ncnnport-cpp check


def test_links_the_pinned_ncnn(cpp_exe):
    res = run_exe("version")
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().strip() == f"ncnn {build_script().NCNN_VERSION}"  # not the build date


def test_make_cpp_relinks_the_current_ncnn_after_an_options_change(cpp_exe, tmp_path):
    """A CMake cache still naming another ncnn install (other options) is overridden, not kept,
    and the build links the current one. In a build tree of its own, one small target: relinking
    build/cpp rewrote the executables other test processes were running (under pytest-xdist a
    worker's exec of build/cpp/ncnnport-cpp met EACCES mid-link)."""
    b = build_script()
    prefix = b.install_dir(b.build_options(b.read_layer_list(), False, b.default_isa("host")))
    other = shutil.copytree(prefix, tmp_path / "ncnn-other-options")
    tree = tmp_path / "cpp"
    subprocess.run(["cmake", "-S", str(CPP), "-B", str(tree), f"-Dncnn_DIR={other}/lib/cmake/ncnn"],
                   capture_output=True, check=True)
    res = run_make("cpp", f"CPP_BUILD={tree}", "CPP_TARGETS=ncnnport-huge-pages-check")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (line,) = [x for x in (tree / "CMakeCache.txt").read_text().splitlines() if x.startswith("ncnn_DIR:")]
    assert line.split("=", 1)[1] == f"{prefix}/lib/cmake/ncnn"
    assert (tree / "ncnnport-huge-pages-check").is_file()
    assert not (tree / "ncnnport-cpp").exists()  # CPP_TARGETS built that target only


def test_check_passes_on_a_converted_package(cpp_exe, converted):
    pkg = converted("qwen3-asr")
    res = run_exe("check", str(pkg))
    assert res.returncode == 0, res.stderr.decode()
    listed = len(json.loads((pkg / "manifest.json").read_text())["files"])
    assert res.stdout.decode().startswith(f"ok: {listed} files")


def test_check_names_the_tampered_file(cpp_exe, converted, tmp_path):
    pkg = shutil.copytree(converted("qwen3-asr"), tmp_path / "pkg")
    changed = next(pkg.rglob("decode_layer0.ncnn.bin"))
    data = bytearray(changed.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: only the sha256 can tell
    changed.write_bytes(bytes(data))
    res = run_exe("check", str(pkg))
    assert res.returncode == 1
    err = res.stderr.decode()
    assert f"{changed.relative_to(pkg).as_posix()}: sha256 differs from manifest" in err
    assert len(err.strip().splitlines()) == 1


def _problems(stderr: bytes, pkg: Path) -> set[str]:
    return {line.removeprefix(f"{pkg}: ") for line in stderr.decode().splitlines()}


def test_check_reports_what_the_python_check_reports(cpp_exe, tmp_path):
    from ncnnport.package.manifest import check_package, write_manifest

    pkg = tmp_path / "pkg"
    (pkg / "ncnn").mkdir(parents=True)
    for name, text in {"a.param": "A", "b.bin": "BB", "c.bin": "CCC", "d.txt": "D", "e.bin": "E"}.items():
        (pkg / "ncnn" / name).write_text(text)
    write_manifest(pkg, model="toy", source="s", config_hash="h", build_key="k", commands=[])
    assert run_exe("check", str(pkg)).returncode == 0
    (pkg / "ncnn" / "a.param").write_text("X")         # same size, other bytes
    (pkg / "ncnn" / "b.bin").write_text("BBBB")        # other size
    (pkg / "ncnn" / "c.bin").unlink()                  # missing
    (pkg / "ncnn" / "extra.bin").write_text("?")       # not listed
    (pkg / "ncnn" / "d.txt").unlink()
    (pkg / "ncnn" / "d.txt").symlink_to(pkg / "ncnn" / "e.bin")  # a link
    (pkg / ".hidden").write_text("ignored by both")
    manifest = json.loads((pkg / "manifest.json").read_text())
    manifest["files"]["../outside.bin"] = {"sha256": "0" * 64, "size": 1}
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    res = run_exe("check", str(pkg))
    assert res.returncode == 1
    assert _problems(res.stderr, pkg) == set(check_package(pkg))
    assert len(check_package(pkg)) == 6


@pytest.mark.parametrize("manifest, expected", [
    (None, "manifest.json: no manifest"),
    ('{"files": {"a.bin": ', "manifest.json: unreadable manifest (not valid JSON)"),
    ('{"files": []}', 'manifest.json: unreadable manifest ("files" is not an object)'),
    ("[1, 2]", 'manifest.json: unreadable manifest (no "files" table)'),
    ('{"files": {"a.bin": {"size": "1", "sha256": "x"}}}', 'a.bin: manifest "size" must be an integer'),
    ('{"files": {"a.bin": {"size": 1, "sha256": 5}}}', 'a.bin: manifest "size" must be an integer and "sha256" a string'),
    ('{"files": {"a.bin": 7}}', 'a.bin: manifest entry needs "size" and "sha256"'),
    ('{"files": {"a.bin": {"size": 1}}}', 'a.bin: manifest entry needs "size" and "sha256"'),
])
def test_check_refuses_a_bad_manifest_in_one_line(cpp_exe, tmp_path, manifest, expected):
    (tmp_path / "a.bin").write_bytes(b"A")
    if manifest is not None:
        (tmp_path / "manifest.json").write_text(manifest)
    res = run_exe("check", str(tmp_path))
    assert res.returncode == 1, "a signal (negative code) would be a crash"
    lines = res.stderr.decode().strip().splitlines()
    assert expected in lines[0] and len(lines) == 1


def test_check_of_a_missing_folder_is_one_line(cpp_exe, tmp_path):
    res = run_exe("check", str(tmp_path / "nope"))
    assert res.returncode == 1 and b"no manifest" in res.stderr


# ---------------------------------------------------------------------------------------------
# ncnnport-cpp tokenize


@pytest.fixture(scope="session")
def tiny_tokenizers(tmp_path_factory) -> dict[str, Path]:
    """tokenizer.json of every tiny preset that has a tokenizer (SeedVR2 has none)."""
    from ncnnport.models.qwen3_asr.presets import preset_folder
    from ncnnport.models.youtu_vl.tokenizer import build_tiny_tokenizer

    youtu = tmp_path_factory.mktemp("youtu_tok")
    build_tiny_tokenizer(youtu)
    qwen = preset_folder("tiny", cache_dir=tmp_path_factory.mktemp("qwen_tok"))
    (qwen_json,) = qwen.rglob("tokenizer.json")
    return {"qwen3-asr": qwen_json, "youtu-vl": youtu / "tokenizer.json"}


def texts_for(tokenizer) -> list[str]:
    """The shared text set plus every added token of this tokenizer inside and around words."""
    added = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
    return TEXTS + [f"a{added[0]}b {added[-1]} c{added[len(added) // 2]}", "".join(added)]


def cpp_encode(path: Path, texts: list[str]) -> list[list[int]]:
    res = run_exe("tokenize", str(path), "--jsonl",
                  stdin="".join(json.dumps(t) + "\n" for t in texts).encode())
    assert res.returncode == 0, res.stderr.decode()
    return [json.loads(line) for line in res.stdout.decode().splitlines()]


def cpp_decode(path: Path, ids: list[int], keep_special: bool = False) -> bytes:
    res = run_exe("tokenize", str(path), "--decode", *(["--keep-special"] if keep_special else []),
                  stdin=" ".join(map(str, ids)).encode())
    assert res.returncode == 0, res.stderr.decode()
    return res.stdout


@pytest.mark.parametrize("model", ["qwen3-asr", "youtu-vl"])
def test_tokenize_ids_equal_tokenizers(cpp_exe, tiny_tokenizers, model):
    from tokenizers import Tokenizer

    path = tiny_tokenizers[model]
    tok = Tokenizer.from_file(str(path))
    texts = texts_for(tok)
    assert cpp_encode(path, texts) == [tok.encode(t).ids for t in texts]


def test_tokenize_argument_form_equals_tokenizers(cpp_exe, tiny_tokenizers):
    from tokenizers import Tokenizer

    path = tiny_tokenizers["qwen3-asr"]
    text = "naïve 中文 <|im_end|> 42"
    res = run_exe("tokenize", str(path), text)
    assert res.returncode == 0, res.stderr
    assert [int(x) for x in res.stdout.split()] == Tokenizer.from_file(str(path)).encode(text).ids


@pytest.mark.parametrize("model", ["qwen3-asr", "youtu-vl"])
def test_decode_bytes_equal_tokenizers(cpp_exe, tiny_tokenizers, model):
    import random

    from tokenizers import Tokenizer

    path = tiny_tokenizers[model]
    tok = Tokenizer.from_file(str(path))
    for text in texts_for(tok):
        ids = tok.encode(text).ids
        assert cpp_decode(path, ids) == tok.decode(ids).encode()
        assert cpp_decode(path, ids, keep_special=True) == tok.decode(ids, skip_special_tokens=False).encode()
    rng = random.Random(0)  # arbitrary ids: split UTF-8 sequences must become U+FFFD as in tokenizers
    for _ in range(20):
        ids = [rng.randrange(tok.get_vocab_size() + 5) for _ in range(rng.randrange(1, 12))]
        assert cpp_decode(path, ids) == tok.decode(ids).encode()


def _variant(path: Path, tmp_path: Path, name: str, **changes) -> Path:
    doc = json.loads(path.read_text())
    for key, value in changes.items():
        if key.startswith("model_"):
            doc["model"][key.removeprefix("model_")] = value
        else:
            doc[key] = value
    out = tmp_path / f"{name}.json"
    out.write_text(json.dumps(doc))
    return out


# The normalizer and pre-tokenizer of the released Qwen2/Qwen3 tokenizer.json files.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.mark.parametrize("name, changes", [
    ("qwen_pipeline", {"normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}}),
    ("prefix_space", {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}}),
    ("ignore_merges", {"model_ignore_merges": True}),
    ("split_removed", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}}),
    ("merges_as_pairs", {}),
    ("template", {"post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [151644], "tokens": ["<|im_start|>"]},
                           "<|im_end|>": {"id": "<|im_end|>", "ids": [151645], "tokens": ["<|im_end|>"]}}}}),
])
def test_other_supported_configurations_equal_tokenizers(cpp_exe, tiny_tokenizers, tmp_path, name, changes):
    from tokenizers import Tokenizer

    base = tiny_tokenizers["qwen3-asr"]
    if name == "merges_as_pairs":
        merges = json.loads(base.read_text())["model"]["merges"]
        changes = {"model_merges": [m.split(" ") if isinstance(m, str) else m for m in merges]}
    path = _variant(base, tmp_path, name, **changes)
    tok = Tokenizer.from_file(str(path))
    texts = texts_for(tok)
    assert cpp_encode(path, texts) == [tok.encode(t).ids for t in texts]


@pytest.mark.parametrize("changes, expected", [
    ({"normalizer": {"type": "Lowercase"}}, "normalizer.type Lowercase is not supported"),
    ({"pre_tokenizer": {"type": "Whitespace"}}, "pre_tokenizer.type Whitespace is not supported"),
    ({"decoder": {"type": "WordPiece"}}, "decoder.type WordPiece is not supported"),
    ({"model_vocab": ["a", "b"]}, "model.vocab is not an object"),
    ({"model_merges": [7]}, 'model.merges[0] is neither "a b" nor [a, b]'),
    ({"model_byte_fallback": True}, "model.byte_fallback=true is not supported"),
    ({"added_tokens": [{"id": "x", "content": "<s>"}]}, "added_tokens[0].id is not a non-negative integer"),
    ({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}},
     "pre_tokenizer.pattern: regex does not compile"),
])
def test_tokenizer_refuses_what_it_cannot_reproduce(cpp_exe, tiny_tokenizers, tmp_path, changes, expected):
    path = _variant(tiny_tokenizers["youtu-vl"], tmp_path, "bad", **changes)
    res = run_exe("tokenize", str(path), "text")
    assert res.returncode == 1
    assert res.stderr.decode().strip() == f"{path}: {expected}" or expected in res.stderr.decode()
    assert len(res.stderr.decode().strip().splitlines()) == 1


def test_tokenizer_refuses_bad_json_and_missing_file(cpp_exe, tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": ')
    res = run_exe("tokenize", str(bad), "x")
    assert res.returncode == 1 and res.stderr.decode().strip() == f"{bad}: not valid JSON"
    res = run_exe("tokenize", str(tmp_path / "nope.json"), "x")
    assert res.returncode == 1 and b"nope.json: cannot open" in res.stderr


def test_decode_refuses_a_non_id(cpp_exe, tiny_tokenizers):
    res = run_exe("tokenize", str(tiny_tokenizers["youtu-vl"]), "--decode", stdin=b"1 2 x3")
    assert res.returncode == 1 and b"'x3' is not a token id" in res.stderr


def test_usage_errors_exit_2(cpp_exe):
    assert run_exe().returncode == 2
    assert run_exe("check").returncode == 2
    assert run_exe("frobnicate", "x").returncode == 2



def test_unpack_refuses_a_member_leaving_the_folder(tmp_path):
    b = build_script()
    evil = tmp_path / "evil.tar.gz"
    payload = tmp_path / "payload"
    payload.write_text("x")
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(payload, arcname="../escaped")
    with pytest.raises(b.BuildError, match=r"refusing archive member '../escaped'"):
        b.unpack(evil, tmp_path / "out")
    assert not (tmp_path / "escaped").exists()
