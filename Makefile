# The two commands of the README: `make demo` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DOCS_VENV := .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.installed

.PHONY: demo test test-fast lint install clean docs

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch/torchvision first and by exact release where this machine keeps them on disk;
	# pyproject pins loosely (torch>=2.4) for everyone else.
	$(BIN)/pip install --quiet "torch>=2.4" "torchvision>=0.19"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/selfsup pretrain moco-v3-vit-digits

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	# the public Python API typed and checked (selfsup.api and what it names; imports followed silently)
	$(BIN)/mypy --ignore-missing-imports --follow-imports=silent src/selfsup/__init__.py src/selfsup/api.py src/selfsup/config_reference.py

test: lint
	$(BIN)/python -m pytest -n 2  # one worker a core (each test runs one torch thread)

# the pure-function and single-process tests: no test marked spawn or train (tests/tiers.py)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n 2 -m "not spawn and not train"

# the site needs only its own dependencies (requirements-docs.txt, a venv of its own) and writes site/ alone;
# docs/config.md is checked fresh by tests/test_docs.py (regenerate: python -m selfsup.config_reference)
$(DOCS_STAMP): requirements-docs.txt
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install --quiet -r requirements-docs.txt
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) $(DOCS_VENV) runs site
