# Each target sets itself up from nothing: a fresh clone needs only python3 (>= 3.11).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test check quick soak demo bench lint typecheck clean agent notebooks docs widgets labextension k8s-bed

# Python caches compiled bytecode for every process here, whatever the environment says: with
# PYTHONDONTWRITEBYTECODE set (as on the machines this runs on) every test process compiled each
# module it imports from source, and pytest rewrote every test file's asserts, each time: 3 x the
# CPU of a process's start (a kernel 2.2 s instead of 0.7, an agent 0.9 instead of 0.3), a third
# of a CI run's CPU.
unexport PYTHONDONTWRITEBYTECODE

# The agent bundle injected into sandboxes without the agent (tools/build_agent.py); rebuilt
# only when the agent's sources change.
ARCH := $(shell uname -m)
AGENT := dist/agent/remote-exec-agent-$(ARCH).tar.gz
AGENT_SRC := $(shell find remote_exec/agent -name '*.py') remote_exec/__init__.py remote_exec/_version.py \
	$(shell find remote_exec/protocol -name "*.py") remote_exec/errors.py tools/build_agent.py tools/agent_entry.py

# uv installs the test environment: ~10 s where pip took ~50 (on CI's critical path, before any
# test runs); the same versions resolved.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q uv
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[test]'
	@# jsonschema's optional IRI format check (pulled in by Jupyter's events) builds an Earley
	@# parser at import: 1.5 s of CPU in every process that imports jsonschema (each pytest
	@# worker, Jupyter server, nbconvert; ~35 s of a CI run's). Nothing here validates an IRI.
	$(BIN)/uv pip uninstall -q --python $(BIN)/python rfc3987-syntax
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check remote_exec tests bench tools notebooks/conftest.py
	$(BIN)/ruff format --check remote_exec tests bench tools notebooks/conftest.py

typecheck: $(STAMP)
	$(BIN)/mypy

# The documentation site (mkdocs.yml) into site/; --strict: every warning is an error.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict  # not --quiet: it would hide the warnings from --strict

$(AGENT): $(STAMP) $(AGENT_SRC)
	$(BIN)/python tools/build_agent.py

agent: $(AGENT)

# The widgets bundled from npm packages (xterm.js for TerminalView) into remote_exec/jupyter/static/,
# from js/ and its lockfile (npm ci: the locked versions exactly). The bundles are committed, so an
# install needs no npm; tests/jupyter/test_assets.py fails `make check` when one is older than js/.
widgets:
	cd js && npm ci --no-audit --no-fund && node build.mjs

# The JupyterLab extension (a saved job record's Reconnect) from labextension/ and its lockfile into
# labextension/built/, committed like the widget bundles; test_assets.py fails `make check` when
# it is older than its sources. jupyter-builder is JupyterLab's build tool (not needed to install).
labextension: $(STAMP)
	$(BIN)/pip install -q jupyter-builder==1.3.0
	$(BIN)/python tools/build_labextension.py

# The Kubernetes real tier (kube-apiserver, etcd, kwok from their Go modules) into
# ~/.cache/remote-exec/k8s-bed: ~11 minutes cold on 2 cores, seconds warm. Where it is built, the
# suite runs the sandbox contract on it too (backend k8s-real); elsewhere those cases skip.
k8s-bed:
	bash tools/k8s_bed/build.sh

# The two tiers (CONTRIBUTING.md states their budgets): each prints its whole time and its 25
# slowest tests. Tests run in a random order (pytest-randomly; the seed is in the header).
TIMED = start=$$(date +%s); trap 'echo "make $@: $$(( $$(date +%s) - start )) s"' EXIT;

# The inner loop: lint and types alongside every test that needs no container engine, sshd,
# bubblewrap, browser, kernel or fresh venv (the `backend` mark, set in tests/conftest.py), on
# the socket channel only (the stdio twins run in `make test`), in four workers: many of these
# tests wait on processes more than they compute.
# nbval's plugin is off outside the notebooks' run: it imports nbformat, whose jsonschema builds
# a URI grammar at import (1 s of CPU in every worker).
QUICK := $(BIN)/pytest -q -n 4 --dist loadgroup -p no:nbval -m "not backend and not slow" -k "not stdio" --durations=25
check: $(STAMP)
	@$(TIMED) $(MAKE) --no-print-directory -j3 --output-sync=target lint typecheck quick

quick: $(STAMP)
	$(QUICK)

# The suite runs in pytest-xdist workers (a state dir each; tests that share a daemon or a
# costly set-up grouped onto one worker: tests/conftest.py), with the notebooks under nbval
# alongside (their own agents, in a scratch dir; not in random order: nbval's items are a
# notebook's cells, run top to bottom). The checks run together first; the agent bundle is the
# only one the tests need. `make test XDIST=` runs the suite in one process.
XDIST ?= -n 3 --dist loadgroup
# The whole suite's order: one shuffled order, fixed, the one a full run was last seen green in
# (`make test ORDER=` for a fresh random one; `make soak` always takes fresh ones). A new order
# is soaked before it becomes the default, so CI never meets an order nobody ran.
ORDER ?= --randomly-seed=1127
NBVAL := $(BIN)/pytest --nbval notebooks --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg -p no:randomly -p no:xdist
test: $(STAMP)
	@$(TIMED) $(MAKE) --no-print-directory -j4 --output-sync=target lint typecheck docs agent || exit 1; \
	nblog=$$(mktemp); $(NBVAL) >$$nblog 2>&1 & nbval=$$!; \
	$(BIN)/pytest $(XDIST) $(ORDER) -p no:nbval --durations=25; suite=$$?; \
	wait $$nbval; notebooks=$$?; echo "== the notebooks (nbval, run alongside the suite)"; cat $$nblog; \
	rm -f $$nblog; exit $$(( suite || notebooks ))

# The flake hunt (issue #22): SOAK_RUNS runs of `make SOAK_TARGET`, each in a new random order,
# with one core kept busy throughout (stress-ng if installed, else a Python busy loop); it stops
# at the first red run. `make soak SOAK_TARGET=check SOAK_RUNS=20` for the quick tier.
SOAK_RUNS ?= 5
SOAK_TARGET ?= test

soak: $(STAMP)
	@if command -v stress-ng >/dev/null; then stress-ng --cpu 1 --quiet & else $(BIN)/python -c 'while True: pass' & fi; \
	busy=$$!; trap 'kill $$busy' EXIT; \
	for i in $$(seq $(SOAK_RUNS)); do \
		echo "== soak $$i/$(SOAK_RUNS): make $(SOAK_TARGET), one core busy (pid $$busy)"; \
		$(MAKE) --no-print-directory $(SOAK_TARGET) ORDER= || exit 1; \
	done; \
	echo "== soak: $(SOAK_RUNS) x make $(SOAK_TARGET), all green"

# Re-run every notebook top to bottom and store its real outputs (what the nbval run above compares).
notebooks: $(STAMP)
	$(BIN)/python tools/run_notebooks.py

demo: $(STAMP)
	$(BIN)/python -m remote_exec.demo

bench: $(STAMP)
	$(BIN)/python bench/run.py
	$(BIN)/python bench/widgets.py
	$(BIN)/python bench/terminal.py  # needs Chromium (.ci/setup-browser.sh)
	$(BIN)/python bench/dashboard.py  # needs Chromium

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache dist/agent site
