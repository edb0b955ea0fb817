# `make demo` and `make test` set themselves up: both create .venv and install
# the project from pyproject.toml before running anything.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench lint clean java chromium

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

java:
	@command -v java >/dev/null 2>&1 || { echo "error: Java 17 is required (PySpark needs it): install openjdk-17-jre-headless" >&2; exit 1; }

demo: $(STAMP)
	$(BIN)/python -m settlement.demo

# The dashboard test runs in a real headless Chromium (Debian's package).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium (the dashboard test needs it)" >&2; \
	  sudo=""; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
	  $$sudo apt-get update -q && $$sudo env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -q --no-install-recommends chromium \
	  || { echo "error: could not install chromium: run 'apt-get install chromium'" >&2; exit 1; }; \
	  command -v chromium >/dev/null 2>&1 || { echo "error: chromium still missing" >&2; exit 1; }; }

test: $(STAMP) java chromium
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench.run

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache
