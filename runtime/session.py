"""One runner interface for a converted graph in ncnn and its wrapper in torch.

Both take and return lists of numpy arrays in the order of the module spec, with shapes
validated against it, so pipelines, parity and benchmarks run unchanged on either backend
(comparing the two separates export bugs from conversion bugs).
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from ncnnport.contract import SUPPORTED_DTYPES, TensorSpec, parse_axis, tensor_specs_from_json, variant_param_name
from ncnnport.package.param_file import read_param
from ncnnport.runtime.concurrent_calls import split_threads
from ncnnport.runtime.huge_pages import back_large_mappings_with_huge_pages
from ncnnport.runtime.mats import from_mat, to_mat
from ncnnport.runtime.options import FP32, RuntimeOptions


class ModuleRunner(Protocol):
    name: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]: ...


class NcnnError(RuntimeError):
    """An ncnn call failed; the message names the module, blob and file."""


_DTYPES = {name: np.dtype(name) for name in SUPPORTED_DTYPES}


def infer_sizes(specs: Sequence[TensorSpec], arrays: Sequence[np.ndarray], *, module: str) -> dict[str, int]:
    """Sizes of named axes read off the inputs; the same axis must agree everywhere."""
    sizes: dict[str, int] = {}
    for t, a in zip(specs, arrays):
        if a.ndim != len(t.shape):
            raise ValueError(f"module {module}, input {t.name}: got rank {a.ndim} shape {a.shape}, "
                             f"spec {t.shape}")
        if a.dtype != _DTYPES[t.dtype]:  # a dtype compare; str(dtype) costs ~4 us per input
            raise TypeError(f"module {module}, input {t.name}: got dtype {a.dtype}, spec {t.dtype}")
        for d, n in zip(t.shape, a.shape):
            if isinstance(d, str):
                axis, offset = parse_axis(d)
                if n - offset < 0 or sizes.setdefault(axis, n - offset) != n - offset:
                    raise ValueError(f"module {module}, input {t.name}: axis {d!r} is {n} here but "
                                     f"{axis}={sizes[axis]} from an earlier input")
            elif d != n:
                raise ValueError(f"module {module}, input {t.name}: got shape {a.shape}, spec {t.shape}")
    return sizes


def check_output(t: TensorSpec, arr: np.ndarray, sizes: Mapping[str, int], *, module: str) -> np.ndarray:
    """Fit ``arr`` to the spec's shape (unit axes only) or fail naming the blob."""
    want: list[int | None] = []
    for d in t.shape:
        if isinstance(d, str):
            axis, offset = parse_axis(d)
            want.append(sizes[axis] + offset if axis in sizes else None)
        else:
            want.append(d)
    if None not in want and math.prod(want) == arr.size:  # type: ignore[arg-type]
        if tuple(arr.shape) != tuple(want):
            squeezed = [n for n in arr.shape if n != 1]
            if squeezed != [n for n in want if n != 1]:
                raise ValueError(f"module {module}, output {t.name}: shape {arr.shape}, expected {tuple(want)}")
            arr = arr.reshape(want)
        return arr
    if arr.ndim != len(t.shape):
        raise ValueError(f"module {module}, output {t.name}: rank {arr.ndim} ({arr.shape}), spec {t.shape}")
    for d, n in zip(want, arr.shape):
        if d is not None and d != n:
            raise ValueError(f"module {module}, output {t.name}: shape {arr.shape}, spec {t.shape} "
                             f"with sizes {dict(sizes)}")
    return arr


class NcnnModule:
    """A converted graph with its own ``ncnn.Net`` and options; one extractor per call."""

    def __init__(self, param: Path, weights: Path, spec: Mapping[str, Any],
                 options: RuntimeOptions = FP32, variant: str | None = None) -> None:
        import ncnn

        # errors name the graph that failed: "llm_layer0.decode" for a variant
        self.name = spec["name"] if variant is None else f"{spec['name']}.{variant}"
        self.spec = dict(spec)
        self.inputs = tensor_specs_from_json(spec["inputs"])
        self.outputs = tensor_specs_from_json(spec["outputs"])
        self.options = options
        self.param, self.weights = Path(param), Path(weights)
        for path in (self.param, self.weights):
            if not path.is_file():
                raise FileNotFoundError(f"module {self.name}: missing {path}")
        parsed = read_param(self.param)  # raises on a truncated or foreign file
        blobs = parsed.blob_names()
        for t in self.inputs:
            if t.name not in blobs:
                raise NcnnError(f"module {self.name}: input blob {t.name!r} not in {self.param}")
        for t in self.outputs:
            if t.name not in blobs:
                raise NcnnError(f"module {self.name}: output blob {t.name!r} not in {self.param}")
        if options.use_vulkan and ncnn.get_gpu_count() == 0:
            # ncnn would silently run on the CPU; a "vulkan" number must come from a GPU
            raise NcnnError(f"module {self.name}: Vulkan requested but ncnn sees no GPU")
        # a graph the pipeline calls several times at once is loaded for one call's share of
        # the threads (concurrent_calls.split_threads: ncnn's Gemm keeps its load-time count).
        # Not on Vulkan (one queue) or with pools emptied after every call (one call's clear
        # would free another's blocks).
        concurrent = spec.get("concurrent_calls", 1)
        if not isinstance(concurrent, int) or isinstance(concurrent, bool) or concurrent < 1:
            raise NcnnError(f"module {self.name}: spec concurrent_calls {concurrent!r} is not an integer >= 1")
        if options.use_vulkan or (spec.get("release_after_call") and options.low_memory):
            concurrent = 1
        self.split = split_threads(options.num_threads, concurrent)
        # run_each's workers live as long as the module: each thread that calls ncnn gets its own
        # OpenMP team, and new threads per batch would start new teams at every layer call (the
        # device's 16 threads, int8 448 window layer: new workers per batch 27-31 ms, slower than
        # one window at a time, 25-27; workers kept 21 ms against 33-35 in the same rounds)
        self._pool: ThreadPoolExecutor | None = None
        # the same graph loaded for all the threads, for a call that would run alone on the
        # split net (see run_each); loaded on the first such call
        self._solo_module: NcnnModule | None = None
        # Graphs whose activations dwarf their weights (a VAE at 512x512: 8 GB for one decode
        # stage) can get their own pools, emptied after every call (``low_memory``): ncnn's
        # per-Net pools otherwise keep each graph's peak, so a chain of such graphs holds the SUM
        # of their peaks (SeedVR2 decode at 512x512: 21.5 GB, 13.9 GB with the pools emptied).
        self._pools: tuple[Any, ...] = ()
        if spec.get("release_after_call") and options.low_memory:
            self._pools = (ncnn.PoolAllocator(), ncnn.PoolAllocator())
        # A split graph loads its net on first use: a process whose calls all come alone (an
        # image of one window) then holds only the net of all the threads (``solo``), not the
        # split one too (Youtu-VL's window segments: most of the vision tower's weights).
        self._net: Any = None
        self._net_lock = threading.Lock()  # guards _net and _variants
        self._variants: dict[tuple[str, RuntimeOptions], NcnnModule] = {}
        if self.split.workers < 2:
            self._net = self._load_net()

    def _load_net(self) -> Any:
        """The ncnn net with this module's options and its share of the threads, loaded."""
        import ncnn

        net = ncnn.Net()
        self.options.apply(net.opt)
        net.opt.num_threads = self.split.threads_each
        if self._pools:
            net.opt.blob_allocator, net.opt.workspace_allocator = self._pools
        if self.options.use_vulkan:
            net.set_vulkan_device(0)
        if net.load_param(str(self.param)) != 0:
            raise NcnnError(f"module {self.name}: ncnn could not load param {self.param}")
        if net.load_model(str(self.weights)) != 0:
            raise NcnnError(f"module {self.name}: ncnn could not load weights {self.weights}")
        if self.options.huge_pages and not self.options.use_vulkan:
            back_large_mappings_with_huge_pages()
        return net

    @property
    def net(self) -> Any:
        """The loaded ncnn net (a split graph's is loaded here, on first use)."""
        if self._net is None:
            with self._net_lock:
                if self._net is None:
                    self._net = self._load_net()
        return self._net

    def variants(self) -> list[str]:
        """Names of the graph variants the spec declares (param files beside this graph)."""
        return [v["name"] for v in self.spec.get("variants", [])]

    def variant(self, name: str, options: RuntimeOptions | None = None) -> "NcnnModule":
        """The module's ``name`` variant graph over the same ``.bin`` (see ``GraphVariant``),
        as its own module with ``options`` (default: this module's). Opened once per name and
        options and kept with this module: the same param over the same weights under the same
        options is the same graph, so every caller (each ``generate``'s decode runners, each size
        of a bench stage) shares it instead of loading the weights again (Youtu-VL real-L4's
        fp16 decode variants: about 2 GB a copy)."""
        if name not in self.variants():
            raise NcnnError(f"module {self.name}: no graph variant {name!r} (declared: {self.variants() or 'none'})")
        key = (name, self.options if options is None else options)
        with self._net_lock:
            if key not in self._variants:
                param = self.param.with_name(variant_param_name(self.spec["name"], name))
                self._variants[key] = NcnnModule(param, self.weights, self.spec, key[1], variant=name)
            return self._variants[key]

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.run_with(arrays)[0]

    def run_each(self, calls: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
        """``[self.run(c) for c in calls]``, up to ``self.split.workers`` of them at a time on
        this net, each on ``self.split.threads_each`` threads: for independent calls too small
        to fill the threads alone (Youtu-VL's windows; the spec's ``concurrent_calls``).
        Outputs in call order, each call validated as ``run`` validates it.

        A call that would run ALONE on the split net (a batch of one, or the one left over
        after the full rounds) runs on the same graph loaded for all the threads instead: the
        split net keeps its load-time share for every call, and one 224x224 window on a quarter
        of the device's 16 threads took 10 ms against 6 ms on all of them. That second net is
        loaded on the first such call, the split net on the first batch of several (see ``net``):
        calls that all come alone hold the weights once, both kinds twice."""
        if self.split.workers < 2:
            return [self.run(c) for c in calls]
        lone = len(calls) % self.split.workers == 1
        together = calls[:-1] if lone else calls
        outs: list[list[np.ndarray]] = []
        if together:
            _ = self.net  # loaded here, not by the first worker while the others wait on the lock
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.split.workers, thread_name_prefix=f"ncnn-{self.name}")
            outs = list(self._pool.map(self.run, together))
        if lone:
            outs.append(self.solo().run(calls[-1]))
        return outs

    def solo(self) -> "NcnnModule":
        """This graph loaded for all the run's threads (itself when the split gives each call
        all of them): what a call that runs alone uses."""
        if self.split.threads_each >= self.options.num_threads:
            return self
        if self._solo_module is None:
            spec = {**self.spec, "concurrent_calls": 1}
            self._solo_module = NcnnModule(self.param, self.weights, spec, self.options)
            self._solo_module.name = self.name
        return self._solo_module

    def run_with(self, arrays: Sequence[np.ndarray],
                 borrow: Callable[[np.ndarray], Any] | None = None) -> tuple[list[np.ndarray], list[str]]:
        """(outputs, names of the inputs handed over without a copy). ``borrow(a)`` may return an
        ncnn Mat over ``a``'s memory (``runtime.zero_copy.ncnn_view``) or None to copy as usual;
        every other check (sizes, input/extract return codes, output shapes) is the same."""
        sizes = infer_sizes(self.inputs, arrays, module=self.name)
        ex = self.net.create_extractor()
        alive = []  # ncnn.Mat borrows these buffers: keep them referenced until extraction ends
        borrowed = []
        for t, a in zip(self.inputs, arrays):
            mat = borrow(a) if borrow is not None else None
            if mat is not None:
                borrowed.append(t.name)
                alive.append((mat, a))
            else:
                mat, buf = to_mat(a, what=f"module {self.name}, input {t.name}")
                alive.append((mat, buf))
            if ex.input(t.name, mat) != 0:
                raise NcnnError(f"module {self.name}: input blob {t.name!r} rejected")
        outs = []
        for t in self.outputs:
            rc, mat = ex.extract(t.name)
            if rc != 0:
                raise NcnnError(f"module {self.name}: extract({t.name!r}) returned {rc} at sizes {sizes}")
            arr = from_mat(mat, len(t.shape), what=f"module {self.name}, output {t.name}")  # a copy
            outs.append(check_output(t, arr, sizes, module=self.name))
        del alive, ex, mat  # every Mat of this call back in the pools before they are emptied
        for pool in self._pools:
            pool.clear()
        return outs, borrowed


class TorchModule:
    """The eager export wrapper behind the same interface (float32 on the CPU)."""

    def __init__(self, module: Any, spec: Mapping[str, Any]) -> None:
        self.name = spec["name"]
        self.spec = dict(spec)
        self.inputs = tensor_specs_from_json(spec["inputs"])
        self.outputs = tensor_specs_from_json(spec["outputs"])
        self.module = module

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        import torch

        sizes = infer_sizes(self.inputs, arrays, module=self.name)
        with torch.inference_mode():
            tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
            result = self.module(*tensors)
        if isinstance(result, torch.Tensor):
            result = (result,)
        if len(result) != len(self.outputs):
            raise ValueError(f"module {self.name}: wrapper returned {len(result)} outputs, spec has {len(self.outputs)}")
        return [check_output(t, r.detach().float().numpy().copy(), sizes, module=self.name)
                for t, r in zip(self.outputs, result)]
