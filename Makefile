# normbench: the two commands a newcomer runs are `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch (README, "The two commands"): with nvidia-smi, PyPI's default build (CUDA on Linux).
# Without it, the CPU build: a torch wheel already on disk (pip's find-links, no network),
# else PyTorch's CPU index, else PyPI's default. The range is pyproject.toml's; TORCH_SPEC=... picks one.
TORCH_SPEC ?= torch>=2.9
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 1)
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1

# The air-gapped node (docs/scale-out.md, "An air-gapped node"): the wheelhouse folder, its target and extras.
WHEELS ?= wheelhouse
WHEEL_PYTHON ?=
WHEEL_PLATFORM ?=
HAVE ?=
WHEEL_EXTRAS ?= sweeps

.PHONY: install install-offline wheelhouse demo test test-slow test-all lint format bench clean

# A .venv the offline install made (its record, scripts/wheelhouse.py) is never brought up to date from an index:
# the targets below say how to re-run the offline install instead (a node without an index would only get pip's
# "No matching distribution found").
OFFLINE_STAMP := $(VENV)/normbench-offline.json

$(BIN)/normbench: pyproject.toml
	@if [ -f "$(OFFLINE_STAMP)" ]; then $(PY) scripts/wheelhouse.py stale --venv "$(VENV)"; exit 2; fi
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
ifeq ($(HAS_GPU),1)
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
else
	$(BIN)/python -m pip install -q --no-index --no-deps "$(TORCH_SPEC)" 2>/dev/null \
		|| $(BIN)/python -m pip install -q --index-url "$(TORCH_CPU_INDEX)" "$(TORCH_SPEC)" \
		|| $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
endif
	$(BIN)/python -m pip install -q -e ".[dev,sweeps,eval]"
	@touch $@

install: $(BIN)/normbench

# the test and lint targets on an offline .venv without the dev extra: what to re-run, not pip's "No module named"
define need_dev
@if [ -f "$(OFFLINE_STAMP)" ] && ! $(BIN)/python -c "import pytest, xdist, ruff" 2>/dev/null; then \
		echo "normbench: error: $(VENV) was installed offline without the dev extra (pytest, ruff): re-run" \
			"make install-offline WHEEL_EXTRAS=sweeps,dev, from a wheelhouse built with WHEEL_EXTRAS=sweeps,dev" >&2; \
		exit 2; fi
endef

# Where an index is reachable: every wheel normbench needs except torch (and its CUDA wheels) into $(WHEELS).
# For another node: WHEEL_PYTHON=3.12 WHEEL_PLATFORM=manylinux_2_28_x86_64; HAVE=FILE (the node's `pip freeze`)
# keeps the node's versions and leaves its packages out.
wheelhouse:
	$(PY) scripts/wheelhouse.py build "$(WHEELS)" --extras "$(WHEEL_EXTRAS)" $(if $(WHEEL_PYTHON),--python-version $(WHEEL_PYTHON)) \
		$(if $(WHEEL_PLATFORM),--platform $(WHEEL_PLATFORM)) $(if $(HAVE),--have "$(HAVE)")

# On a node without an index: $(VENV) sees $(PY)'s packages (its own torch) and gets normbench (editable) and
# the wheels of $(WHEELS), with no network and no pip configuration; a requirement found nowhere is named, in one line.
install-offline:
	$(PY) scripts/wheelhouse.py install "$(WHEELS)" --python "$(PY)" --venv "$(VENV)" --extras "$(WHEEL_EXTRAS)"

# A real training run on the built-in corpus (KJV, byte tokenizer), a few minutes on 2 CPU cores.
# DEMO_OVERRIDES: more Hydra overrides (e.g. trainer.max_steps=30 for a short one).
DEMO_OVERRIDES ?=
demo: install
	WANDB_MODE=disabled $(BIN)/python -m normbench train arch=pre_ln norm=rmsnorm hydra.run.dir=outputs/demo $(DEMO_OVERRIDES)
	$(BIN)/python -m normbench report outputs/demo

# The default suite, in parallel over the cores (pytest-xdist, at most 4 workers; each test's trainings run on one
# thread, tests/conftest.py). Tests marked `slow` (200-step trainings of every
# placement and norm, claim sweeps) run in `make test-slow`; CI runs both.
test: install
	$(need_dev)
	WANDB_MODE=offline $(BIN)/python -m pytest -q -m "not slow" -n auto --maxprocesses=4 || { rc=$$?; [ $$rc -ne 5 ] || echo "pytest collected no tests" >&2; exit $$rc; }

test-slow: install
	$(need_dev)
	WANDB_MODE=offline $(BIN)/python -m pytest -q -m slow -n auto --maxprocesses=4 || { rc=$$?; [ $$rc -ne 5 ] || echo "pytest collected no tests" >&2; exit $$rc; }

test-all: install
	$(need_dev)
	WANDB_MODE=offline $(BIN)/python -m pytest -q -n auto --maxprocesses=4

lint: install
	$(need_dev)
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts

format: install
	$(need_dev)
	$(BIN)/ruff format src tests scripts
	$(BIN)/ruff check --fix src tests scripts

bench: install
	$(BIN)/python scripts/bench_throughput.py

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache
