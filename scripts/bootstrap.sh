#!/usr/bin/env bash
# scripts/bootstrap.sh [test|demo-embedded|demo-cluster]
#   demo-embedded  .venv-demo: faultwatch's node side + torch (no root, no Java, no test tools)
#   demo-cluster   .venv-demo + Faust (the processor), and the Kafka jars (Java 17 + Maven)
#   test (default) everything the tests need, below.
# For the tests: install the two environments, once per pyproject.toml version, then resolve
# the Kafka broker jars from Maven Central (cached):
#   .venv        the processor's: faultwatch[processor,kubernetes,torch,test] (Faust, the
#                Kubernetes client, torch, test tools)
#   .venv-train  a training image: faultwatch's node side only, beside the newest torch,
#                transformers, accelerate and lightning (no Faust: it pins click<8.4)
# Both are installed by uv, so torch (GBs) is downloaded once into uv's cache and hard-linked
# into each env. Set FAULTWATCH_NO_TRAIN_ENV=1 to skip .venv-train.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-test}
PY=$(command -v "${PYTHON:-python3}")
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 required"'
export UV_LINK_MODE=hardlink UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1
# (the stamp also covers the native part's build: setup.py builds the matcher's fast path,
# native/ (Rust, PyO3), in place at the editable install when cargo is found; optional:
# without cargo the install goes on without it and the matcher takes its exact path)
want=$(cat pyproject.toml setup.py native/Cargo.toml native/Cargo.lock native/src/*.rs | sha256sum | cut -c1-16)

if [ "$MODE" = demo-embedded ] || [ "$MODE" = demo-cluster ]; then
  extras=""; [ "$MODE" = demo-cluster ] && extras="[processor]"
  stamp="$want$extras"
  if [ "$(cat .venv-demo/.faultwatch-install 2>/dev/null)" != "$stamp" ]; then
    echo "bootstrap: installing faultwatch$extras and torch into .venv-demo (first run downloads torch, ~1 GB of wheels, plus ~3 GB of NVIDIA libraries it depends on; a few minutes)" >&2
    start=$SECONDS
    [ -x .venv-demo/bin/python ] || "$PY" -m venv .venv-demo
    [ -x .venv-demo/bin/uv ] || .venv-demo/bin/python -m pip install -q --disable-pip-version-check uv
    .venv-demo/bin/uv pip install -q --python .venv-demo/bin/python -e ".$extras" torch
    echo "$stamp" > .venv-demo/.faultwatch-install
    echo "bootstrap: .venv-demo ready in $((SECONDS - start)) s" >&2
  fi
  if [ "$MODE" = demo-cluster ]; then
    for tool in java mvn; do
      command -v "$tool" >/dev/null || { echo "bootstrap: the cluster demo needs $tool (Java 17 + Maven run the local Kafka broker); the embedded demo needs neither" >&2; exit 1; }
    done
    .venv-demo/bin/faultwatch kafka fetch >/dev/null
  fi
  exit 0
fi
[ "$MODE" = test ] || { echo "usage: $0 [test|demo-embedded|demo-cluster]" >&2; exit 2; }

for tool in java mvn; do
  command -v "$tool" >/dev/null || { echo "bootstrap: $tool is required (Java 17 + Maven run the local Kafka broker)" >&2; exit 1; }
done
# Debian packages the tests run for real: Slurm (slurmctld + two slurmd) with munge, Prometheus
# (scrapes /metrics; its promtool checks and unit-tests deploy/prometheus/), Alertmanager
# (notify's receiver; amtool checks deploy/alertmanager/), systemd-analyze
# (verifies deploy/'s unit file), tmux (the status view in a real terminal), chromium (the
# report's HTML page opened headless, driven by Playwright: no browser is ever downloaded).
# Installed when missing.
debs=()
command -v slurmctld >/dev/null && command -v slurmd >/dev/null || debs+=(slurm-wlm)
command -v munged >/dev/null || debs+=(munge)
command -v prometheus >/dev/null && command -v promtool >/dev/null || debs+=(prometheus)
command -v prometheus-alertmanager >/dev/null && command -v amtool >/dev/null \
  || debs+=(prometheus-alertmanager)
command -v systemd-analyze >/dev/null || debs+=(systemd)
command -v tmux >/dev/null || debs+=(tmux)
command -v openssl >/dev/null || debs+=(openssl)
command -v chromium >/dev/null || debs+=(chromium)
if [ ${#debs[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages: ${debs[*]}" >&2
  SUDO=; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${debs[@]}" >&2
fi

stale() { [ "$(cat "$1" 2>/dev/null)" != "$want" ]; }

# Bytecode once at install: where PYTHONDONTWRITEBYTECODE is set (as on CI machines) no .pyc is
# ever written, and every process compiles what it imports: `import torch` took 5.5 s of CPU
# without and 2.6 s with, a faultwatch processor's imports 1.9 s and 0.7 s (2026-11-26). The
# suite starts hundreds of such processes. ~30-60 s per env on 2 cores; errors (py2-only files
# some packages ship) are ignored.
compile_bytecode() {
  local t=$SECONDS
  "$1/bin/python" -m compileall -q -j 0 \
    "$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    faultwatch >/dev/null 2>&1 || true
  echo "bootstrap: $1 bytecode compiled in $((SECONDS - t)) s" >&2
}

[ -x .venv/bin/python ] || "$PY" -m venv .venv
if stale .venv/.faultwatch-install; then
  echo "bootstrap: installing faultwatch[processor,kubernetes,torch,test] into .venv (torch is large; first run takes minutes)" >&2
  start=$SECONDS
  [ -x .venv/bin/uv ] || .venv/bin/python -m pip install -q --disable-pip-version-check uv
  .venv/bin/uv pip install -q --python .venv/bin/python --reinstall-package faultwatch \
    -e ".[processor,kubernetes,torch,test]"
  compile_bytecode .venv
  echo "$want" > .venv/.faultwatch-install
  echo "bootstrap: .venv ready in $((SECONDS - start)) s" >&2
fi

if [ -z "${FAULTWATCH_NO_TRAIN_ENV:-}" ] && stale .venv-train/.faultwatch-install; then
  echo "bootstrap: installing the training image .venv-train (faultwatch node side + newest torch, transformers, accelerate, lightning)" >&2
  start=$SECONDS
  rm -rf .venv-train  # fresh, so the resolver takes the newest releases (no --upgrade: it
  .venv/bin/uv venv -q --python "$PY" .venv-train  # would re-download torch past the cache)
  .venv/bin/uv pip install -q --python .venv-train/bin/python \
    -e . torch transformers accelerate lightning
  .venv/bin/uv pip check --python .venv-train/bin/python >&2
  compile_bytecode .venv-train
  echo "$want" > .venv-train/.faultwatch-install
  echo "bootstrap: .venv-train ready in $((SECONDS - start)) s" >&2
fi
.venv/bin/faultwatch kafka fetch >/dev/null
