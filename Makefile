# ncnnport: every target creates its own virtualenv on first use; nothing needs installing first.
# Targets mirror the CLI verbs and take the same options:
#   make parity [MODEL=qwen3-asr] [PRESET=tiny] [CKPT=/path/to/hf-folder] [LAYERS=K] [ARGS="--input a.wav"]
#   make run MODEL=qwen3-asr ARGS="--audio clip.wav"
#   PRECISION=fp16-storage (run, parity, bench; runtime/precision.py lists the vocabulary)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODEL ?=
PRESET ?= tiny
CKPT ?=
LAYERS ?=
ARGS ?=
PRECISION ?=
# the speed table runs once per entry (same vocabulary as PRECISION); the Youtu-VL vision encoder
# meets its target under bf16 on a CPU with AVX-512 BF16 (the EPYC) and under int8-weights on the
# Intel Xeons with VNNI (docs/performance.md, "Youtu-VL vision at 1024 and the cap"); int8-weights is also item 7's decode mode
PERF_PRECISIONS ?= fp32 fp16-storage bf16 int8-weights
STAMP := $(VENV)/.ncnnport-installed

MODEL_OPTS = $(MODEL) --preset $(PRESET) $(if $(CKPT),--ckpt $(CKPT)) $(if $(LAYERS),--layers $(LAYERS))
PRECISION_OPT = $(if $(PRECISION),--precision $(PRECISION))

.PHONY: setup export convert parity report check run test bench bench-perf bench-cpp nightly clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@

# `export` must stand alone on its rule line: "export a b:" would be read as make's export directive.
export: $(STAMP)
	$(BIN)/ncnnport export $(MODEL_OPTS) $(ARGS)

convert report check: $(STAMP)
	$(BIN)/ncnnport $@ $(MODEL_OPTS) $(ARGS)

parity bench: $(STAMP)
	$(BIN)/ncnnport $@ $(MODEL_OPTS) $(PRECISION_OPT) $(ARGS)

# Speed at real layer dims (every model unless MODEL=...): ncnn vs PyTorch eager on the same work
# and thread count (decode per token at positions ~100 and ~1000, Youtu-VL vision 448/1024, SeedVR2
# DiT block and VAE 256/512), against the memory-bandwidth bound measured in the same run; one
# table per entry of PERF_PRECISIONS (PRECISION=X: that one only).
bench-perf: PRESET = real
bench-perf: LAYERS = 4
bench-perf: $(STAMP)
	set -e; for p in $(or $(PRECISION),$(PERF_PRECISIONS)); do \
	  $(if $(filter 1,$(HUGEPAGES)),GLIBC_TUNABLES=glibc.malloc.hugetlb=1) $(if $(THREADS_LIST),,OMP_NUM_THREADS=$(or $(THREADS),1)) $(BIN)/ncnnport bench $(MODEL_OPTS) --perf --threads $(or $(THREADS),1) $(if $(THREADS_LIST),--threads-list $(THREADS_LIST)) --precision $$p $(ARGS); \
	done

# Youtu-VL vision encoder at real width, per layer (one window block per window, one full-attention
# block; encoder = 23 window + 4 full), ncnn vs torch interleaved; the patch cap is extrapolated and
# labelled so (models/youtu_vl/vision_bench.py; a whole 1024 encoder call is minutes per runtime).
.PHONY: bench-vision
bench-vision: $(STAMP)
	$(BIN)/python -m ncnnport.models.youtu_vl.vision_bench --threads $(or $(THREADS),1) $(ARGS)

# The shipped C++ loop vs the Python ncnn loop vs PyTorch eager (every model with an executable unless
# MODEL=...), one thread, real widths, 4 layers: per-token decode at prompts of 100 and 1000 tokens
# (16 new tokens; C++ and Python ids asserted equal) and the C++ loop's overhead over its graphs
# (target <= 5 %); SeedVR2 one 256x256 image end to end. Builds the executables (`make cpp`) and the
# package when missing; table printed, JSON + Markdown in build/reports/bench-cpp/. PRECISION=fp16-storage
# runs both ncnn loops with fp16 InnerProduct weights (torch stays fp32; the bound counts 2 bytes each).
bench-cpp: PRESET = real
bench-cpp: LAYERS = 4
bench-cpp: cpp
	set -e; for m in $(or $(MODEL),$(CPP_MODELS)); do \
	  OMP_NUM_THREADS=1 $(BIN)/ncnnport bench-cpp $$m --preset $(PRESET) $(if $(CKPT),--ckpt $(CKPT)) $(if $(LAYERS),--layers $(LAYERS)) $(PRECISION_OPT) $(ARGS); \
	done

nightly: $(STAMP)
	$(BIN)/ncnnport nightly $(MODEL_OPTS) $(ARGS)

run: $(STAMP)
	@test -n "$(MODEL)" || (echo "make run needs MODEL=..." >&2; exit 2)
	$(BIN)/ncnnport run $(MODEL_OPTS) $(PRECISION_OPT) $(ARGS)

# Vulkan tests run on lavapipe (software Vulkan) where no GPU is present: .ci/vulkan-driver installs
# Debian's mesa-vulkan-drivers when missing (as root with apt-get; otherwise it says so).
# TEST_WORKERS: pytest-xdist processes, one test file each at a time (--dist loadfile keeps a file's
# module fixtures in one process); default one per core, at most 4; TEST_WORKERS=0 runs in-process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
test: $(STAMP)
	@.ci/vulkan-driver
	$(BIN)/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(ARGS)

clean:
	rm -rf build

# C++ runtime (runtime/cpp): the pinned ncnn sdist built once, static, into
# ~/.cache/ncnnport/ncnn-<version>-<options hash>/ (only the layer types of runtime/cpp/ncnn_layers.txt;
# VULKAN=1 adds the Vulkan backend, NCNN_ISA=avx2 drops the AVX-512 copy, NCNN_ISA=all keeps every x86 ISA copy), then the ncnnport_rt
# library and the ncnnport-cpp executable in build/cpp[-vulkan]/. Installs missing apt packages.
VULKAN ?=
NCNN_ISA ?= avx512
NCNN_OPTS = --isa $(NCNN_ISA) $(if $(filter 1,$(VULKAN)),--vulkan)
CPP_BUILD = build/cpp$(if $(filter 1,$(VULKAN)),-vulkan)
# CPP_TARGETS=...: build only these CMake targets (e.g. ncnnport-youtu-vl); empty builds them all
CPP_TARGETS ?=

.PHONY: cpp
cpp: $(STAMP)
	$(BIN)/python runtime/cpp/build_ncnn.py $(NCNN_OPTS)
	@mkdir -p $(dir $(CPP_BUILD))
	nice -n 19 cmake -S runtime/cpp -B $(CPP_BUILD) -Dncnn_DIR="$$($(BIN)/python runtime/cpp/build_ncnn.py $(NCNN_OPTS) --no-apt --print-prefix)/lib/cmake/ncnn" > $(CPP_BUILD).configure.log || (cat $(CPP_BUILD).configure.log; exit 1)
	nice -n 19 cmake --build $(CPP_BUILD) -j2 $(if $(CPP_TARGETS),--target $(CPP_TARGETS))

# `make cpp-vulkan-verify [MODEL=...] [PRESET=tiny] [LAYERS=K]`: `make cpp VULKAN=1`, then per model its
# package (convert reuses an up-to-date one), `ncnnport-cpp verify --vulkan` (golden rows judged by the
# packaged policy's vulkan_fp32 budgets, as `ncnnport verify --backend vulkan`) and one packaged e2e case
# through the model's executable with --vulkan. Needs a Vulkan device (lavapipe: mesa-vulkan-drivers).
.PHONY: cpp-vulkan-verify
cpp-vulkan-verify:
	@test -z "$(CKPT)" || (echo "make cpp-vulkan-verify takes PRESET/LAYERS, not CKPT" >&2; exit 2)
	$(MAKE) cpp VULKAN=1
	set -e; for m in $(or $(MODEL),$(CPP_MODELS)); do \
	  $(BIN)/ncnnport convert $$m --preset $(PRESET) $(if $(LAYERS),--layers $(LAYERS)) > build/cpp-vulkan.convert-$$m.log; \
	  build/cpp-vulkan/ncnnport-cpp verify build/$$m/$(PRESET)$(if $(LAYERS),-L$(LAYERS))/package --vulkan; \
	  $(BIN)/python -m ncnnport.drivers.cpp_package_cases $$m build/$$m/$(PRESET)$(if $(LAYERS),-L$(LAYERS))/package --exe-dir build/cpp-vulkan --vulkan; \
	done

# Second platform: aarch64, cross-compiled with Debian's g++-aarch64-linux-gnu (the toolchain file
# runtime/cpp/toolchains/aarch64-linux-gnu.cmake; arm64 -dev libraries from Debian multiarch) and
# run under qemu-user. The cross ncnn (NEON + Armv8.2 fp16 copies, the same layer list) is cached
# in ~/.cache/ncnnport/ncnn-<version>-aarch64-<hash>/ like the host build; ncnnport_rt and
# ncnnport-cpp go to build/cpp-aarch64/. Installs missing apt packages (dpkg --add-architecture arm64).
# `make cpp-aarch64-verify [MODEL=...] [PRESET=tiny] [LAYERS=K]` converts each model's package (reused
# when up to date) and runs `ncnnport-cpp verify` on it under qemu-aarch64 (exit 1 on a failed row), one
# thread: with --threads 2 the OpenMP run under qemu-user 7.2 did not finish in 10 min (one thread: 2 s);
# then one packaged e2e case per model (the smallest inputs) through the model's cross-built executable
# under qemu, token ids / frames against the case's expected values (ncnnport/drivers/cpp_package_cases.py;
# a model without a C++ executable says "skipped").
AARCH64_BUILD = build/cpp-aarch64
AARCH64_NCNN = $(BIN)/python runtime/cpp/build_ncnn.py --target aarch64
QEMU_AARCH64 = QEMU_LD_PREFIX=/usr/aarch64-linux-gnu qemu-aarch64
CPP_MODELS ?= qwen3-asr youtu-vl seedvr2

.PHONY: cpp-aarch64 cpp-aarch64-verify
cpp-aarch64: $(STAMP)
	$(AARCH64_NCNN)
	@mkdir -p build
	nice -n 19 cmake -S runtime/cpp -B $(AARCH64_BUILD) -DCMAKE_TOOLCHAIN_FILE="$$($(AARCH64_NCNN) --print-toolchain)" -Dncnn_DIR="$$($(AARCH64_NCNN) --no-apt --print-prefix)/lib/cmake/ncnn" > $(AARCH64_BUILD).configure.log || (cat $(AARCH64_BUILD).configure.log; exit 1)
	nice -n 19 cmake --build $(AARCH64_BUILD) -j2

cpp-aarch64-verify: cpp-aarch64
	@test -z "$(CKPT)" || (echo "make cpp-aarch64-verify takes PRESET/LAYERS, not CKPT" >&2; exit 2)
	set -e; for m in $(or $(MODEL),$(CPP_MODELS)); do \
	  $(BIN)/ncnnport convert $$m --preset $(PRESET) $(if $(LAYERS),--layers $(LAYERS)) > build/cpp-aarch64.convert-$$m.log; \
	  $(QEMU_AARCH64) $(AARCH64_BUILD)/ncnnport-cpp verify build/$$m/$(PRESET)$(if $(LAYERS),-L$(LAYERS))/package --threads 1 $(ARGS); \
	  QEMU_LD_PREFIX=/usr/aarch64-linux-gnu $(BIN)/python -m ncnnport.drivers.cpp_package_cases $$m build/$$m/$(PRESET)$(if $(LAYERS),-L$(LAYERS))/package --exe-dir $(AARCH64_BUILD) --launcher qemu-aarch64; \
	done
