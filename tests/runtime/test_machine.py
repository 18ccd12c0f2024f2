"""The machine record names the CPU and the ISA features ncnn dispatches on."""

from ncnnport.runtime.machine import describe, machine_record, parse_cpuinfo

X86 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse4_1 avx f16c fma avx2 avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16

processor\t: 1
model name\t: other
"""

ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm fphp asimdhp asimddp sve i8mm bf16
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""


def test_x86_record_lists_the_flags_ncnn_dispatches_on():
    rec = parse_cpuinfo(X86)
    assert rec["cpu_model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert rec["isa_features"] == ["sse4_1", "avx", "f16c", "fma", "avx2", "avx512f", "avx512bw",
                                   "avx512_bf16", "avx512_fp16", "amx_bf16"]


def test_arm_record_names_implementer_and_fp16_features():
    rec = parse_cpuinfo(ARM)
    assert rec["cpu_model"] == "implementer 0x41 part 0xd40"
    assert rec["isa_features"] == ["fphp", "asimdhp", "asimddp", "bf16", "i8mm", "sve"]


def test_this_machine_record_has_versions(tmp_path):
    rec = machine_record()
    assert rec["ncnn"] != "not installed" and rec["torch"] != "not installed"
    assert "ncnn" in describe(rec)
    assert set(rec["ncnn_dispatch"]) >= {"x86_avx", "x86_avx2", "arm_asimdhp"}
    assert machine_record(tmp_path / "missing")["isa_features"] == []


def test_speed_table_heading_names_cpu_features_threads_and_bandwidth(tmp_path, monkeypatch):
    import ncnnport.runtime.machine as machine

    monkeypatch.setattr(machine, "device_record", lambda: (_ for _ in ()).throw(AssertionError("Vulkan probed")))
    info = tmp_path / "cpuinfo"
    info.write_text(X86)
    rec = machine.cpu_record(info)                      # no Vulkan probe for a speed table
    line = machine.table_heading(rec, 4, 23.46, "malloc huge pages off")
    assert line.startswith("machine: Intel(R) Xeon(R) Platinum 8480+ (")
    assert "avx2 avx512f" in line and "threads 4" in line and "read bandwidth 23.5 GB/s" in line
    assert line.endswith("; malloc huge pages off")
