#!/usr/bin/env bash
# `make test`: the tests that need no broker, then those that need one on the
# embedded broker and on Apache Kafka, as three pytest sessions running side
# by side. Most broker tests wait (for locks to lapse, engines to start,
# Spark micro-batches) rather than compute, so the three together take little
# longer than the longest alone. Each session writes its own log; they are
# printed in turn once all have ended, then how long each took; this fails
# if any session failed.
#
# Usage: tests/run-all.sh PYTHON [PYTEST_ARGS...]   (SUITES="none embedded kafka")
set -uo pipefail
python=$1
shift
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

declare -A pids
for broker in ${SUITES:-none embedded kafka}; do
  (
    start=$(date +%s)
    SETTLEMENT_TEST_BROKER=$broker "$python" -m pytest -q -p no:cacheprovider "$@" \
      >"$logs/$broker.log" 2>&1
    status=$?
    echo "make test: broker=$broker took $(( $(date +%s) - start )) s" >"$logs/$broker.time"
    exit $status
  ) &
  pids[$broker]=$!
done

failed=""
for broker in ${SUITES:-none embedded kafka}; do
  wait "${pids[$broker]}" || failed="$failed $broker"
done
for broker in ${SUITES:-none embedded kafka}; do
  echo "=== SETTLEMENT_TEST_BROKER=$broker"
  cat "$logs/$broker.log"
done
for broker in ${SUITES:-none embedded kafka}; do
  cat "$logs/$broker.time"
done
if [ -n "$failed" ]; then
  echo "make test: failed on:$failed" >&2
  exit 1
fi
