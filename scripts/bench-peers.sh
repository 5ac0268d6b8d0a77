#!/usr/bin/env bash
# scripts/bench-peers.sh [PACKAGE...]: install the Debian packages of the benches' peers
# (bench/README.md): ripgrep (matcher_throughput.py) and kcat (agent_throughput.py), the ones
# missing. The tests need neither, so scripts/bootstrap.sh does not install them.
set -euo pipefail
want=("$@"); [ ${#want[@]} -gt 0 ] || want=(ripgrep kcat)
missing=()
for pkg in "${want[@]}"; do
  case $pkg in
    ripgrep) command -v rg >/dev/null || missing+=(ripgrep) ;;
    kcat) command -v kcat >/dev/null || command -v kafkacat >/dev/null || missing+=(kcat) ;;
    *) echo "bench-peers: unknown peer package $pkg (ripgrep, kcat)" >&2; exit 2 ;;
  esac
done
[ ${#missing[@]} -gt 0 ] || exit 0
command -v apt-get >/dev/null || {
  echo "bench-peers: no apt-get here: install ${missing[*]} with your package manager" >&2
  exit 1; }
SUDO=; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
echo "bench-peers: installing ${missing[*]}" >&2
$SUDO apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >&2
