# Two entry points for a fresh machine: `make demo` (install, small CPU sweep, report)
# and `make test` (install, the test suite). Everything else is a building block.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# CPU machines (no nvidia-smi) take the local CPU wheel; GPU machines get pip's normal torch.
TORCH_CPU := torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast lint bytecode report ui bench coord gpu-check reliability clean-runs

# pip compiles each installed module to bytecode one file at a time, half of the install's CPU: it installs
# without, and compileall compiles them on every core, but for the packages' own test suites (a fifth of the
# source, never imported). A module for another Python (torch's py312_intrinsics) fails to compile there, as
# it does, silently, under pip.
SITE_PACKAGES = $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	command -v nvidia-smi >/dev/null 2>&1 || $(BIN)/python -m pip install -q --no-compile $(TORCH_CPU)
	$(BIN)/python -m pip install -q --no-compile -e '.[dev]'
	$(BIN)/python -m compileall -qq -j 0 -x '/site-packages/.+/tests?/' "$(SITE_PACKAGES)" || true
	touch $@

install: $(STAMP)

# The embedded default: DDL d_v=1, d_v=4 and the baseline on CPU (tiny model, CPython's docs),
# evaluated offline with lm-eval, then the report. Re-running skips finished jobs.
demo: install
	$(BIN)/ddl-run -m +sweep=demo
	$(MAKE) --no-print-directory report

# Three pytest-xdist workers, each on its share of the cores: while one waits on a server, the others compute;
# the tests of each private server (SLURM, the team's MLflow) share one worker (tests/conftest.py, docs/testing.md).
PYTEST := $(BIN)/python -m pytest -q -n 3 --dist loadgroup

test: install lint bytecode
	scripts/system-deps
	$(PYTEST)

# The contributor's loop: every test not marked slow (pyproject's markers). How the suite runs: docs/testing.md.
test-fast: install lint bytecode
	scripts/system-deps
	$(PYTEST) -m "not slow"

# The project's own modules compiled before the suite: where PYTHONDONTWRITEBYTECODE is set, each of the ~700
# processes it starts (drivers, jobs, scripts) would compile the ddl modules it imports again.
bytecode: install
	$(BIN)/python -m compileall -q ddl hydra_plugins

# pyflakes and bugbear at the project's line length (pyproject's [tool.ruff]).
lint: install
	$(BIN)/ruff check .

report: install
	$(BIN)/ddl-report

ui: install
	$(BIN)/ddl-ui

# The cost of the Delta residual against the baseline (same-process ratios) and of the orchestrator;
# `python -m ddl.bench --orchestrator`: the orchestrator's figures alone (start-up, the 1,000-job plan, a sweep's
# jobs warm and cold), in about a minute; `--model`: the model arms alone.
# Then `python -m ddl.data.bench`: ddl-data prepare's tokens/s on 1 and 2 workers, the loader's ms per batch.
bench: install
	$(BIN)/python -m ddl.bench
	$(BIN)/python -m ddl.data.bench

# µP's coordinate check: every row at widths 128-512 for 3 steps under sp and mup, judged; reports/coord/.
coord: install
	$(BIN)/python -m ddl.coord

# On a machine with a CUDA GPU (nvidia-smi): its own python and torch, nothing installed but omegaconf (the
# resume part's ddl.train reads keys with it); parts in GPU_CHECK (default train,step,resume); reports/gpu-check/.
# Without one: one line, exit 0. ddl/gpu_check.py says what each part measures.
GPU_PYTHON ?= python3
GPU_CHECK  ?=
gpu-check:
	@if command -v nvidia-smi >/dev/null 2>&1; then \
	  $(GPU_PYTHON) -c 'import omegaconf' 2>/dev/null || $(GPU_PYTHON) -m pip install -q omegaconf; \
	  $(GPU_PYTHON) -m ddl.gpu_check $(GPU_CHECK); \
	else $(MAKE) --no-print-directory install && $(BIN)/python -m ddl.gpu_check; fi

# Bad inputs and damaged files against a scratch DDL_HOME: the table of docs/reliability.md.
reliability: install
	$(BIN)/python scripts/hostile-inputs

clean-runs:
	rm -rf .ddl reports/*/
