"""Resumable export and convert: an interrupted run continues, finished modules are not redone."""

from __future__ import annotations

import pytest

from ncnnport.fsutil import read_json
from ncnnport.registry import LoadedModel, ModelPort
from ncnnport.targets import Target
from tests.toys import ToyAttention, toy_spec


class Interrupted(Exception):
    pass


class _Port(ModelPort):
    name = "toy"

    def load(self, preset, ckpt):  # pragma: no cover - not called
        raise AssertionError

    def module_specs(self, loaded):  # pragma: no cover - not called
        raise AssertionError

    def e2e_parity(self, ctx):  # pragma: no cover - not called
        raise AssertionError

    def module_weight_bytes(self, loaded):
        return {"toy_a": 1000, "toy_b": 1000, "toy_c": 1000}


def _prepared(root, builds: list[str], fail_on: set[str]):
    from ncnnport.stages import Prepared

    def builder(name):
        def build():
            builds.append(name)
            if name in fail_on:
                fail_on.discard(name)
                raise Interrupted(name)
            return ToyAttention().eval()
        return build

    specs = [toy_spec(name=n, build=builder(n)) for n in ("toy_a", "toy_b", "toy_c")]
    loaded = LoadedModel("toy", "tiny", None, config={}, reference=None)
    return Prepared(Target("toy", "tiny", None, root), _Port(), loaded, None, specs, "key-1", "cfg")


def test_export_resumes_after_an_interruption(tmp_path, capsys):
    from ncnnport.stages import export_stage

    builds: list[str] = []
    prep = _prepared(tmp_path, builds, {"toy_b"})
    with pytest.raises(Interrupted):
        export_stage(prep)
    progress = read_json(prep.target.torchscript_dir / "progress.json")
    assert list(progress["done"]) == ["toy_a"] and progress["done"]["toy_a"]["peak_rss_mb"] > 0
    assert not (prep.target.torchscript_dir / "toy_b.pt").exists()
    records = export_stage(prep)
    assert builds == ["toy_a", "toy_b", "toy_b", "toy_c"]           # toy_a not rebuilt
    assert [r["name"] for r in records] == ["toy_a", "toy_b", "toy_c"]
    err = capsys.readouterr().err
    assert "export resumes: 1/3" in err and "ETA" in err and "[3/3] toy_c" in err
    # a recorded module whose file vanished is redone; the others are kept
    (prep.target.torchscript_dir / "toy_c.pt").unlink()
    (prep.target.state_file).unlink()
    builds.clear()
    export_stage(prep)
    assert builds == ["toy_c"]
    # a different build key starts afresh
    prep2 = _prepared(tmp_path, builds, set())
    prep2.build_key = "key-2"
    builds.clear()
    export_stage(prep2)
    assert builds == ["toy_a", "toy_b", "toy_c"]


@pytest.mark.slow
def test_convert_resumes_and_records_memory(tmp_path, monkeypatch):
    import ncnnport.stages as stages
    from ncnnport.package.manifest import check_package

    builds: list[str] = []
    prep = _prepared(tmp_path, builds, set())
    converted: list[str] = []
    real = stages.convert_module
    fail = {"toy_c"}

    def flaky(rec, *a, **k):
        converted.append(rec["name"])
        if rec["name"] in fail:
            fail.discard(rec["name"])
            raise Interrupted(rec["name"])
        return real(rec, *a, **k)

    monkeypatch.setattr(stages, "convert_module", flaky)
    with pytest.raises(Interrupted):
        stages.convert_stage(prep)
    partial = prep.target.package_dir.with_name("package.partial")
    assert set(read_json(partial / ".progress.json")["done"]) == {"toy_a", "toy_b"}
    assert not prep.target.package_dir.exists()                    # no half package
    pkg = stages.convert_stage(prep)
    assert converted == ["toy_a", "toy_b", "toy_c", "toy_c"]       # only the unfinished one redone
    assert builds == ["toy_a", "toy_b", "toy_c"]                    # export ran once
    assert check_package(pkg) == [] and not partial.exists()
    manifest = read_json(pkg / "manifest.json")
    assert [c["module"] for c in manifest["pnnx_commands"]] == ["toy_a", "toy_b", "toy_c"]
    mem = manifest["memory"]
    assert mem["convert"]["peak_rss_mb"] > mem["convert"]["baseline_rss_mb"] * 0.5
    assert mem["export"]["peak_rss_mb"] > 0 and 0 < mem["pnnx"]["peak_rss_mb"] < 2000
    assert all(c["pnnx_peak_rss_mb"] > 0 for c in manifest["pnnx_commands"])
    converted.clear()
    assert stages.convert_stage(prep) == pkg and converted == []   # up to date


def test_layers_option_is_refused_by_a_port_without_support(monkeypatch, tmp_path):
    import ncnnport.stages as stages
    from ncnnport.cli import build_parser

    monkeypatch.setattr(stages, "get_port", lambda name: _Port())
    with pytest.raises(ValueError, match="does not support --layers"):
        stages.prepare(Target("toy", "tiny", None, tmp_path, layers=2))
    args = build_parser().parse_args(["convert", "qwen3-asr", "--preset", "real", "--layers", "4"])
    assert args.layers == 4 and args.preset == "real"


def test_streamed_convert_keeps_one_trace_at_a_time_and_resumes(tmp_path):
    """keep_traces=False (the default above STREAM_TRACES_ABOVE): each module is traced, converted
    and its trace deleted before the next; an interruption resumes with the unfinished module."""
    from ncnnport.stages import convert_stage

    builds: list[str] = []
    prep = _prepared(tmp_path, builds, {"toy_c"})
    with pytest.raises(Interrupted):
        convert_stage(prep, keep_traces=False)
    assert builds == ["toy_a", "toy_b", "toy_c"]
    assert not list(prep.target.torchscript_dir.glob("*.pt"))        # converted traces are gone
    pkg = convert_stage(prep, keep_traces=False)
    assert builds == ["toy_a", "toy_b", "toy_c", "toy_c"]             # only the unfinished one again
    assert not list(prep.target.torchscript_dir.glob("*.pt"))
    manifest = read_json(pkg / "manifest.json")
    assert manifest["memory"]["streamed_traces"] is True
    assert manifest["memory"]["export"]["peak_rss_mb"] > 0
    assert sorted(p.name for p in (pkg / "ncnn").glob("*.param")) == [f"toy_{c}.ncnn.param" for c in "abc"]
    assert convert_stage(prep) == pkg and len(builds) == 4             # up to date: nothing traced
