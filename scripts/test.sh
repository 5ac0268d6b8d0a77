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
.venv/bin/python -m pytest tests -q --reruns 1 --reruns-delay 2 --durations=40 "$@"
