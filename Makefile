# `make demo` and `make test` set themselves up: both create .venv and install
# the project from pyproject.toml before running anything.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench bench-scale bench-topics bench-sessions bench-pairing bench-aio lint clean java chromium maven

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

java:
	@command -v java >/dev/null 2>&1 || { echo "error: Java 17 is required (PySpark needs it): install openjdk-17-jre-headless" >&2; exit 1; }

demo: $(STAMP)
	$(BIN)/python -m settlement.demo

# Debian packages the tests need, installed with apt-get when their command is
# missing: $(call apt_install,COMMAND,PACKAGE,WHY).
define apt_install
	@command -v $(1) >/dev/null 2>&1 || { \
	  echo "installing Debian's $(2) ($(3))" >&2; \
	  sudo=""; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
	  $$sudo apt-get update -q && $$sudo env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -q --no-install-recommends $(2) \
	  || { echo "error: could not install $(2): run 'apt-get install $(2)'" >&2; exit 1; }; \
	  command -v $(1) >/dev/null 2>&1 || { echo "error: $(1) still missing" >&2; exit 1; }; }
endef

chromium:
	$(call apt_install,chromium,chromium,the dashboard test runs in a real headless Chromium)

maven:
	$(call apt_install,mvn,maven,it fetches Apache Kafka's jars from Maven Central)

# The tests that need no broker once, every test that needs one on Apache Kafka
# (one node; the fault tests start their own three), and the compatibility
# subset (marked `tansu`) on Tansu: three pytest sessions one after the other
# (tests/run-all.sh), each's time printed; fails if any failed.
# make test PYTEST_ARGS="-x -k sessions" narrows them.
test: $(STAMP) java chromium maven
	bash tests/run-all.sh $(BIN)/python $(PYTEST_ARGS)

# make bench [BROKER=kafka|tansu] [ARGS="--messages 50000"]
BROKER ?= kafka
bench: $(STAMP) java maven
	$(BIN)/python -m bench.run --broker $(BROKER) $(ARGS)

# make bench-scale [BROKER=kafka|tansu] [ARGS="--parked 1000000"]: state that
# scales with what is in flight (a million dead letters, a million backlog)
bench-scale: $(STAMP) java maven
	$(BIN)/python -m bench.scale --broker $(BROKER) $(ARGS)

# make bench-topics [BROKER=kafka|tansu] [ARGS="--messages 50000"]: one topic,
# 10 subscriptions with SQL filters selecting 10% each, beside a plain queue
bench-topics: $(STAMP) java maven
	$(BIN)/python -m bench.topics --broker $(BROKER) $(ARGS)

# make bench-sessions [BROKER=kafka|tansu] [ARGS="--sessions 10000"]: sessions
# of 10 (2,000 by default) drained by 4 NEXT_AVAILABLE_SESSION receivers beside
# a plain queue, and the commands of a session beside 100,000 idle ones
bench-sessions: $(STAMP) java maven
	$(BIN)/python -m bench.sessions --broker $(BROKER) $(ARGS)

# make bench-pairing [BROKER=kafka|tansu] [ARGS="--failover-interval 5"]: a
# client paired with a second cluster, sending while its primary is healthy,
# paused (SIGSTOP) and back (SIGCONT), with the syphon moving the backlog home
bench-pairing: $(STAMP) java maven
	$(BIN)/python -m bench.pairing --broker $(BROKER) $(ARGS)

# make bench-aio [BROKER=kafka|tansu] [ARGS="--messages 50000"]: settlement.aio's
# 1,000 concurrent await complete_message, beside the sync batched peek-lock and
# raw Kafka consume on the same broker
bench-aio: $(STAMP) java maven
	$(BIN)/python -m bench.aio --broker $(BROKER) $(ARGS)

# ruff, mypy (configured in pyproject.toml) and the import contracts of the
# layers (import-linter, [tool.importlinter] in pyproject.toml)
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache
