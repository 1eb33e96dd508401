# normbench: the two commands a newcomer runs are `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch: take the CPU wheel this machine keeps on disk when there is no GPU; a machine with
# nvidia-smi gets PyPI's default (CUDA) build. Override with `make install TORCH_SPEC=...`.
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo "torch>=2.9" || echo "torch==2.13.0")
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1

.PHONY: install demo test test-fast lint format bench clean

$(BIN)/normbench: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev,sweeps]"
	@touch $@

install: $(BIN)/normbench

# A real training run on the built-in corpus (KJV, byte tokenizer), a few minutes on 2 CPU cores.
demo: install
	WANDB_MODE=disabled $(BIN)/python -m normbench train arch=pre_ln norm=rmsnorm hydra.run.dir=outputs/demo
	$(BIN)/python -m normbench report outputs/demo

test: install
	WANDB_MODE=offline $(BIN)/python -m pytest -q || { rc=$$?; [ $$rc -ne 5 ] || echo "pytest collected no tests" >&2; exit $$rc; }

test-fast: install
	WANDB_MODE=offline $(BIN)/python -m pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts

format: install
	$(BIN)/ruff format src tests scripts
	$(BIN)/ruff check --fix src tests scripts

bench: install
	$(BIN)/python scripts/bench_throughput.py

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache
