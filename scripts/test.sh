#!/usr/bin/env bash
# The whole test suite on a fresh machine: install, lint, type-check, then unit,
# integration (real Kafka broker from local jars) and end-to-end tests (real torchrun).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
# A real kube-apiserver, etcd and kube-controller-manager for tests/integration/test_kubernetes_api.py,
# built from the Go module proxy once per version and cached (~8 min on 2 cores the first time).
if command -v go >/dev/null; then scripts/k8s-api.sh build >/dev/null; fi
.venv/bin/ruff check faultwatch tests bench examples
.venv/bin/mypy faultwatch
.venv/bin/faultwatch rules test
# One rerun for a failed test: the end-to-end tests time real torchrun jobs, brokers and
# Slurm on 2 cores; a rerun shows as R in the summary, a real failure fails twice.
# Three pytest-xdist workers, one test file each at a time (--dist loadfile keeps a file's
# module fixtures on one worker): the long tests mostly wait on timers, brokers and torch
# start-up, so three overlap well on 2 cores. They share one Kafka broker, and take the files
# with the most slow tests first (tests/conftest.py; --no-loadscope-reorder keeps that order
# instead of xdist's most-tests-first, which left the long end-to-end files for last).
# FAULTWATCH_TEST_WORKERS=0 runs serially (tests/README.md).
workers=${FAULTWATCH_TEST_WORKERS:-3}
xdist=(); [ "$workers" != 0 ] && xdist=(-n "$workers" --dist loadfile --no-loadscope-reorder)
.venv/bin/python -m pytest tests -q "${xdist[@]}" --reruns 1 --reruns-delay 2 --durations=40 "$@"
