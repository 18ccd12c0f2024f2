"""GPU machine only (run by hand, never by CI): real-dimension Youtu-VL (seeded real preset, LAYERS=2) built with ncnnport's own
stages on the device, then timed: ncnn Vulkan fp32 / fp16 and ncnn CPU vs torch eager CUDA and
CPU, for the LLM layers at cache 100 and 1000 (per layer) and the vision encoder at 448x448 and
1024x1024. Parity columns: ncnn output vs torch fp32 CPU on the same inputs (vision) or vs ncnn
CPU fp32 (layers: same random latent cache). Medians of repeated runs.

Usage on the device (Vulkan loader and NVIDIA ICD set up as the device README says):
    STAGES=layers,vision_encoder OUT=out python3 tools/youtu_gpu_bench.py
Writes ``youtu_gpu.json`` into ``$OUT`` after every row and prints a markdown table."""
import copy
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from ncnnport.metrics import compare
from ncnnport.runtime.options import RuntimeOptions
from ncnnport.drivers.torch_ratio import median_ms
from ncnnport.stages import convert_stage, prepare
from ncnnport.runtime.lazy_modules import open_ncnn_modules
from ncnnport.targets import Target

OUT = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="youtu_gpu_"))
LAYERS = 2
t0 = time.time()
BUILD = Path(os.environ.get("NCNNPORT_DEVICE_BUILD") or tempfile.mkdtemp(prefix="youtu_build_"))
prep = prepare(Target("youtu-vl", "real", None, BUILD, layers=LAYERS))
pkg = convert_stage(prep)
print(f"built real L{LAYERS} in {time.time() - t0:.0f} s", flush=True)
port, loaded = prep.port, prep.loaded
vl = loaded.reference


def med(fn, runs, warm=3):
    return median_ms(fn, runs, warmup=warm)


backends = {"ncnn cpu t16": RuntimeOptions(num_threads=16), "ncnn vulkan fp32": RuntimeOptions(use_vulkan=True),
            "ncnn vulkan fp16": RuntimeOptions(use_vulkan=True, fp16_storage=True, fp16_packed=True,
                                               fp16_arithmetic=True)}
rows = []
full = vl.full()
PLAN = (("layers", ("100", "1000"), 30), ("vision_encoder", ("448x448", "1024x1024"), 10))
ONLY = os.environ.get("STAGES")
for stage, sizes, runs in PLAN:
    if ONLY and stage not in ONLY.split(","):
        continue
    for size in sizes:
        ref = None
        for label, opts in backends.items():
            mods = open_ncnn_modules(pkg, options=opts)
            call = port.bench_call(loaded, mods, stage, size)
            t = time.perf_counter()
            out = call()
            first = (time.perf_counter() - t) * 1e3
            if ref is None:
                ref = out
            s = compare(ref[0], out[0])
            rows.append({"stage": stage, "size": size, "backend": label, "median_ms": med(call, runs),
                         "first_ms": first, "cos_vs_cpu": s.cosine, "rel_vs_cpu": s.max_abs / max(s.ref_absmax, 1e-30)})
            print(rows[-1], flush=True)
            (OUT / "youtu_gpu.json").write_text(json.dumps({"layers": LAYERS, "rows": rows}, indent=1))
            del mods, call
        for dev in ("cpu", "cuda"):
            torch.set_num_threads(16)
            if stage == "layers":
                from transformers import DynamicCache
                llm = copy.deepcopy(full.llm).to(dev) if dev == "cuda" else full.llm
                past = int(size)
                g = torch.Generator().manual_seed(0)
                cache = DynamicCache(config=llm.config)
                import inspect
                kw = "cache" if "cache" in inspect.signature(llm.model.forward).parameters else "past_key_values"
                with torch.no_grad():
                    llm.model(inputs_embeds=torch.randn(1, past, vl.cfg.text.hidden_size, generator=g).to(dev),
                              use_cache=True, **{kw: cache})
                assert cache.get_seq_length() == past, cache.get_seq_length()
                hidden = torch.randn(1, 1, vl.cfg.text.hidden_size, generator=g).to(dev)
                pos = torch.tensor([[past]], device=dev)

                def f():
                    with torch.no_grad():
                        r = llm.model(inputs_embeds=hidden, position_ids=pos, use_cache=True, **{kw: cache})
                    cache.crop(-1)
                    if dev == "cuda":
                        torch.cuda.synchronize()
                    return r
            else:
                from ncnnport.models.youtu_vl.bench import bench_image
                image = bench_image(vl, size)
                tower = copy.deepcopy(full.siglip2.vision_model).to(dev) if dev == "cuda" else full.siglip2.vision_model
                merger = copy.deepcopy(full.merger).to(dev) if dev == "cuda" else full.merger
                pv = torch.from_numpy(image.pixel_values).to(dev)

                def f():
                    with torch.no_grad():
                        r = merger(tower(pv, image.grid_hw))
                    if dev == "cuda":
                        torch.cuda.synchronize()
                    return r
            rows.append({"stage": stage, "size": size, "backend": f"torch eager {dev}" + (" t16" if dev == "cpu" else ""),
                         "median_ms": med(f, runs), "first_ms": None, "cos_vs_cpu": None, "rel_vs_cpu": None})
            print(rows[-1], flush=True)
            if dev == "cuda":
                del f
                torch.cuda.empty_cache()
(OUT / "youtu_gpu.json").write_text(json.dumps({"layers": LAYERS, "rows": rows}, indent=1))
print("| stage | size | backend | median ms | first call ms | cosine vs ncnn cpu | max_abs/max|ref| |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    c = "-" if r["cos_vs_cpu"] is None else f"{r['cos_vs_cpu']:.7f}"
    e = "-" if r["rel_vs_cpu"] is None else f"{r['rel_vs_cpu']:.2e}"
    fm = "-" if r["first_ms"] is None else f"{r['first_ms']:.1f}"
    print(f"| {r['stage']} | {r['size']} | {r['backend']} | {r['median_ms']:.2f} | {fm} | {c} | {e} |")
