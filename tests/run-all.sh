#!/usr/bin/env bash
# `make test`: the tests that need no broker, then every test that needs one on
# Apache Kafka, then the compatibility subset (tests marked `tansu`) on Tansu,
# as three pytest sessions one after the other (side by side they take longer:
# Tansu keeps a core busy answering its consumers' short fetches). The Kafka
# session runs its test files on two pytest-xdist workers, each with its own
# broker and engine: its tests mostly wait (for locks to lapse, brokers to
# restart, logs to be trimmed), the machine ~80 % idle when they run one at a
# time. Every session runs even when one before it failed; how long each took
# is printed at the end, and this fails if any session failed.
#
# Usage: tests/run-all.sh PYTHON [PYTEST_ARGS...]   (SUITES="none kafka tansu")
set -uo pipefail
python=$1
shift

failed=""
times=""
for broker in ${SUITES:-none kafka tansu}; do
  echo "=== SETTLEMENT_TEST_BROKER=$broker"
  start=$(date +%s)
  workers=()
  [ "$broker" = kafka ] && workers=(-n 2 --dist loadfile)  # a file's tests on one worker
  SETTLEMENT_TEST_BROKER=$broker "$python" -m pytest -q -p no:cacheprovider "${workers[@]}" "$@" \
    || failed="$failed $broker"
  times="${times}make test: broker=$broker took $(( $(date +%s) - start )) s"$'\n'
done
printf '%s' "$times"
if [ -n "$failed" ]; then
  echo "make test: failed on:$failed" >&2
  exit 1
fi
