# ncnnport: every target creates its own virtualenv on first use; nothing needs installing first.
# Targets mirror the CLI verbs and take the same options:
#   make parity [MODEL=qwen3-asr] [PRESET=tiny] [CKPT=/path/to/hf-folder] [ARGS="--input a.wav"]
#   make run MODEL=qwen3-asr ARGS="--audio clip.wav"
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODEL ?=
PRESET ?= tiny
CKPT ?=
ARGS ?=
STAMP := $(VENV)/.ncnnport-installed

MODEL_OPTS = $(MODEL) --preset $(PRESET) $(if $(CKPT),--ckpt $(CKPT))

.PHONY: setup export convert parity report check run test bench nightly clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@

export convert parity report check: $(STAMP)
	$(BIN)/ncnnport $@ $(MODEL_OPTS) $(ARGS)

run: $(STAMP)
	@test -n "$(MODEL)" || (echo "make run needs MODEL=..." >&2; exit 2)
	$(BIN)/ncnnport run $(MODEL_OPTS) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(ARGS)

clean:
	rm -rf build
