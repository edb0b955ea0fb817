# `make demo` and `make test` set themselves up: both create .venv and install
# the project from pyproject.toml before running anything.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench lint clean java

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

java:
	@command -v java >/dev/null 2>&1 || { echo "error: Java 17 is required (PySpark needs it): install openjdk-17-jre-headless" >&2; exit 1; }

demo: $(STAMP)
	$(BIN)/python -m settlement.demo

test: $(STAMP) java
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench.run

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache
