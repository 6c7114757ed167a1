# Each target sets itself up from nothing: a fresh clone needs only python3 (>= 3.11).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo bench lint typecheck clean agent

# The agent bundle injected into sandboxes without the agent (tools/build_agent.py); rebuilt
# only when the agent's sources change.
ARCH := $(shell uname -m)
AGENT := dist/agent/remote-exec-agent-$(ARCH).tar.gz
AGENT_SRC := $(shell find remote_exec/agent -name '*.py') remote_exec/__init__.py remote_exec/_version.py \
	$(shell find remote_exec/protocol -name "*.py") remote_exec/errors.py tools/build_agent.py tools/agent_entry.py

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check remote_exec tests bench tools
	$(BIN)/ruff format --check remote_exec tests bench tools

typecheck: $(STAMP)
	$(BIN)/mypy

$(AGENT): $(STAMP) $(AGENT_SRC)
	$(BIN)/python tools/build_agent.py

agent: $(AGENT)

test: lint typecheck $(AGENT)
	$(BIN)/pytest

demo: $(STAMP)
	$(BIN)/python -m remote_exec.demo

bench: $(STAMP)
	$(BIN)/python bench/run.py
	$(BIN)/python bench/widgets.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache dist/agent
