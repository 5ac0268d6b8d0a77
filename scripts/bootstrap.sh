#!/usr/bin/env bash
# Create .venv and install faultwatch with its training (torch) and test extras, once per
# pyproject.toml version; then resolve the Kafka broker jars from Maven Central (cached).
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in java mvn; do
  command -v "$tool" >/dev/null || { echo "bootstrap: $tool is required (Java 17 + Maven run the local Kafka broker)" >&2; exit 1; }
done
PY=${PYTHON:-python3}
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 required"'

[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.faultwatch-install
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing faultwatch[torch,test] into .venv (torch is large; first run takes minutes)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[torch,test]"
  echo "$want" > "$stamp"
fi
.venv/bin/faultwatch kafka fetch >/dev/null
