# coop: build the environment, run the demo, the tests and the benchmarks.
# `make demo` and `make test` work from a fresh clone with only Python 3.11 and pip.

# The CPU build of torch (pip takes the wheel on disk where there is one); override for CUDA.
TORCH_SPEC ?= torch==2.13.0
PYTHON_BOOT := $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.coop-installed
# Two workers when pytest-xdist is there: the suite is CPU-bound and the machine has 2 cores. The 25 slowest tests
# are listed at the end, so that a CI log shows where the suite's minutes go. `--dist loadfile` keeps a file on one
# worker, so that a module's fixture (a compiled step, every bench_cuda case) is built once, not once per worker.
PYTEST_ARGS ?= -q -n 2 --dist loadfile --durations=25
# `make test` (what CI runs) is the fast tier: every test but those marked `slow` (the end-to-end cases on the
# larger models, each with a smaller test of the same path and oracle in the fast tier); `make test-all` runs both.
FAST_TIER := -m "not slow"

.PHONY: install demo test test-all test-oldest smoke lint bench clean

# see the install rule: the first import of a module keeps its bytecode for every later process
unexport PYTHONDONTWRITEBYTECODE

install: $(STAMP)

# pip upgraded first: the pip Python 3.11.7 bundles (23.2.1) resolved and installed coop's dependencies in 63 s
# against 36 s for the current one, after its 4 s upgrade (fresh `make test`, 2026-11-29)
$(PY):
	$(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip

# Re-run only when the package metadata changes: torch pinned in the same resolution, so that pip never resolves a
# CUDA build. `--no-compile`: pip would compile all 13,480 installed modules to bytecode one file after another, and
# `compileall -j 0` over them took about 40 s on 2 cores; the suite imports 4,051 of them. Python compiles a module the
# first time it is imported instead and keeps the bytecode, but not where PYTHONDONTWRITEBYTECODE is set (as on the
# machine image coop is developed on), where each process would compile torch anew (27 s against 11 s to import torch,
# transformers and the solvers, 2026-11-29): make's commands run without it (`unexport` above), so the first process
# that imports a module writes its bytecode for every later one.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --no-compile "$(TORCH_SPEC)" -e ".[test,dev]"
	touch $(STAMP)

demo: install
	@if [ -f examples/demo.py ]; then \
		$(PY) examples/demo.py; \
	else \
		$(MAKE) --no-print-directory demo-cli; \
	fi

# The CLI tour, used until examples/demo.py exists: a published graph shipped in graphs/moccasin.
DEMO_GRAPH ?= graphs/moccasin/VGG16_256_224_224_3_train_nx.json
DEMO_OUT := out/demo
.PHONY: demo-cli
demo-cli: install
	@mkdir -p $(DEMO_OUT)
	@if [ ! -f "$(DEMO_GRAPH)" ]; then echo "no $(DEMO_GRAPH): give DEMO_GRAPH=path/to/graph.json"; exit 2; fi
	$(VENV)/bin/coop info $(DEMO_GRAPH)
	$(VENV)/bin/coop solve $(DEMO_GRAPH) --budget 100% --formulation store-all -o $(DEMO_OUT)/store_all.json
	$(VENV)/bin/coop solve $(DEMO_GRAPH) --budget 90% --formulation chen-greedy -o $(DEMO_OUT)/chen_greedy.json
	$(VENV)/bin/coop validate $(DEMO_GRAPH) $(DEMO_OUT)/chen_greedy.json
	$(VENV)/bin/coop plot $(DEMO_GRAPH) $(DEMO_OUT)/store_all.json $(DEMO_OUT)/chen_greedy.json -o $(DEMO_OUT)/memory.png

test: install
	$(PY) -m pytest $(PYTEST_ARGS) $(FAST_TIER)
	$(VENV)/bin/ruff check .

test-all: install
	$(PY) -m pytest $(PYTEST_ARGS)
	$(VENV)/bin/ruff check .

# The range we claim is the range we test: the oldest torch and transformers that pyproject.toml declares, in their
# own venv, then the suite as `make test` runs it. PyPI has no CPU wheel of an older torch, so pip takes the CUDA
# build (about 4 GB with its nvidia-* wheels; it runs on CPU). The torch spec is given again with the package so that
# pip keeps it (a spec below the declared floor is a resolver error, not a silent upgrade).
OLDEST_TORCH_SPEC ?= torch==2.10.0
OLDEST_TRANSFORMERS_SPEC ?= transformers==5.17.0
OLDEST_VENV := .venv-oldest
OLDEST_PY := $(OLDEST_VENV)/bin/python

$(OLDEST_PY):
	$(PYTHON_BOOT) -m venv $(OLDEST_VENV)
	$(OLDEST_PY) -m pip install --upgrade pip

test-oldest: | $(OLDEST_PY)
	$(OLDEST_PY) -m pip install "$(OLDEST_TORCH_SPEC)"
	$(OLDEST_PY) -m pip install -e ".[test]" "$(OLDEST_TORCH_SPEC)" "$(OLDEST_TRANSFORMERS_SPEC)"
	$(OLDEST_PY) -c "import torch, transformers; print('test-oldest: torch', torch.__version__, 'transformers', transformers.__version__)"
	$(OLDEST_PY) -m pytest $(PYTEST_ARGS) $(FAST_TIER)

# What a user gets: a fresh venv, torch, then `pip install .` (not editable, no extras), `pip check`, and the smoke
# script run from outside the source tree (a plan with optimizer steps, `coop simulate`, `coop compare`).
SMOKE_VENV := .venv-smoke
smoke:
	rm -rf $(SMOKE_VENV)
	$(PYTHON_BOOT) -m venv $(SMOKE_VENV)
	$(SMOKE_VENV)/bin/python -m pip install -q --upgrade pip
	$(SMOKE_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(SMOKE_VENV)/bin/python -m pip install -q .
	$(SMOKE_VENV)/bin/python -m pip check
	cd "$$(mktemp -d)" && $(CURDIR)/$(SMOKE_VENV)/bin/python $(CURDIR)/.ci/smoke.py

lint: install
	$(VENV)/bin/ruff check .

bench: install
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) $(SMOKE_VENV) $(OLDEST_VENV) out build dist *.egg-info .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
