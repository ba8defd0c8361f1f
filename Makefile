# make serve: set up and serve the shipped bundles on 127.0.0.1:8000.  make test: lint + every test.
# make test-service: the service's tests in a venv without torch (.venv-service).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
SVENV := .venv-service
# A bundle, or a directory of bundles (each one served).
BUNDLE ?= model/bundles

.PHONY: serve derive test test-service lint format clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.service: pyproject.toml service/runtime/*.c service/runtime/*.h | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.dev: pyproject.toml service/runtime/*.c service/runtime/*.h | $(BIN)/python
	$(BIN)/pip install -q -e '.[train,dev]'
	touch $@ $(VENV)/.service

$(SVENV)/.test: pyproject.toml service/runtime/*.c service/runtime/*.h
	$(PY) -m venv $(SVENV)
	$(SVENV)/bin/pip install -q --upgrade pip
	$(SVENV)/bin/pip install -q -e '.[test]'
	touch $@

# The bundles' int8 graphs, derived from their shipped graphs (service/runtime/derive.py); serve would derive them on start.
derive: $(VENV)/.service
	$(BIN)/attnserve derive $(BUNDLE)

serve: derive
	$(BIN)/attnserve serve --bundle $(BUNDLE) --host 127.0.0.1 --port 8000

lint: $(VENV)/.dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy --strict service
	$(BIN)/python tools/import_cycles.py service model

test: lint
	$(BIN)/python -m pytest -q

test-service: $(SVENV)/.test
	$(SVENV)/bin/python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is not None)'
	$(SVENV)/bin/python -m pytest -q tests/service

# The Docker image built and run (tests/deploy/test_image.py): needs root, docker.io and debootstrap.
.PHONY: image-test
image-test: $(VENV)/.dev
	$(BIN)/python -m pytest -q -m image tests/deploy/test_image.py

# A minute of mixed load (tests/bench/test_soak.py, bench/soak.py): make test runs it under CI=true.
.PHONY: soak-test
soak-test: $(VENV)/.dev
	$(BIN)/python -m pytest -q -m soak tests/bench/test_soak.py

format: $(VENV)/.dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) $(SVENV) .mypy_cache .pytest_cache .ruff_cache
