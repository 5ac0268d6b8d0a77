#!/usr/bin/env bash
# faultwatch watching a real 2-rank torchrun job (gloo on CPU).
#   scripts/demo.sh            embedded mode: one process, no Kafka. Installs faultwatch (node
#                              side) and torch into .venv-demo: no root, no Java, no test tools
#   scripts/demo.sh cluster    agent -> local Kafka broker -> processor -> decisions topic; adds
#                              Faust to .venv-demo and needs Java 17 + Maven for the broker
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-embedded}
case "$MODE" in embedded|cluster) ;; *) echo "usage: $0 [embedded|cluster]" >&2; exit 2 ;; esac
scripts/bootstrap.sh "demo-$MODE"
export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore FW_STEPS=8
FW=.venv-demo/bin/faultwatch
JOB=(.venv-demo/bin/torchrun --standalone --nproc-per-node 2 examples/train_gloo.py)

banner() { printf '\n\033[1m== %s ==\033[0m\n' "$*"; }

# The hang window: a healthy torchrun is silent between its ranks' last line and its exit
# (interpreter and gloo teardown): 1-2 s on an idle machine, 5-15 s measured under a load of
# 15-28 on 2 cores (11.5 s at 20, 19.3 s at 28), where a 5 s window decided false hangs: 30 s.
# Its start (torchrun and two ranks importing torch) took over 120 s at a load of 22, the
# default init window: 300 s.
WINDOW_S=${FAULTWATCH_DEMO_WINDOW_S:-30}
INIT_S=${FAULTWATCH_DEMO_INIT_WINDOW_S:-300}
if [ "$MODE" = "embedded" ]; then
  # each run ends with its goodput line ("faultwatch: goodput ... of ...: ... restart, ..."):
  # where the wall time went (docs/goodput.md)
  banner "1/2 rank 1 raises a retryable network error in attempt 0: expect RESTART, then success"
  rc=0; FW_FAULT=retryable FW_FAULT_ATTEMPTS=0 $FW run --settle-s 1 --hang-window-s "$WINDOW_S" --init-window-s "$INIT_S" -- "${JOB[@]}" || rc=$?
  echo "exit code: $rc"
  banner "2/2 rank 1 stops before an all-reduce in attempt 0: expect a HANG restart ~${WINDOW_S} s later"
  rc=0; FW_FAULT=hang FW_FAULT_ATTEMPTS=0 $FW run --settle-s 1 --hang-window-s "$WINDOW_S" --init-window-s "$INIT_S" -- "${JOB[@]}" || rc=$?
  echo "exit code: $rc"
  exit 0
fi

PORT=${FAULTWATCH_DEMO_PORT:-19392}
DATA=.faultwatch/demo-kafka
PREFIX="demo$(date +%s)."
banner "starting a local Kafka broker (KRaft, jars from Maven Central)"
BOOT=$($FW kafka up --port "$PORT" --data-dir "$DATA")
echo "bootstrap: $BOOT"
$FW process --bootstrap "$BOOT" --topic-prefix "$PREFIX" --settle-s 1 --hang-window-s "$WINDOW_S" --init-window-s "$INIT_S" \
  > .faultwatch/demo-processor.log 2>&1 &
PROC=$!
trap 'kill $PROC 2>/dev/null; wait $PROC 2>/dev/null; $FW kafka down --port "$PORT" --data-dir "$DATA" >/dev/null' EXIT
sleep 3
# The agent and the job from the training image .venv-train (node side beside the newest torch
# stack) when the tests built it, else from .venv-demo.
TRAIN=.venv-demo; [ -x .venv-train/bin/faultwatch ] && TRAIN=.venv-train
banner "agent ($TRAIN) runs the job; rank 1 raises a retryable error in attempt 0; the agent acts on the decision"
FW_FAULT=retryable FW_FAULT_ATTEMPTS=0 $TRAIN/bin/faultwatch agent --bootstrap "$BOOT" \
  --topic-prefix "$PREFIX" --job demo --node node-0 --follow-decisions \
  -- $TRAIN/bin/torchrun --standalone --nproc-per-node 2 examples/train_gloo.py || rc=$?
echo "agent exit code: ${rc:-0}"
banner "faultwatch decisions --job demo"
$FW decisions --bootstrap "$BOOT" --topic-prefix "$PREFIX" --job demo
banner "faultwatch logs demo (last lines)"
$FW logs demo --bootstrap "$BOOT" --topic-prefix "$PREFIX" | tail -n 8
