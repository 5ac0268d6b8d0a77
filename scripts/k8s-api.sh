#!/usr/bin/env bash
# A real Kubernetes API server (kube-apiserver + etcd, and kube-controller-manager for PDB
# status) built from the Go module proxy once per version and cached, then started on loopback.
#   scripts/k8s-api.sh build             build (or find cached) binaries and fetch the published
#                                        CRDs deploy/ needs (KEDA's); prints the bin dir
#   scripts/k8s-api.sh crds              fetch (or find cached) those CRDs; prints their dir
#   scripts/k8s-api.sh kubeflow          build (or find cached) `kfexit CODE...`: Kubeflow
#                                        training-operator's own IsRetryableExitCode per code
#   scripts/k8s-api.sh start DIR         start etcd, kube-apiserver, kube-controller-manager with
#                                        state in DIR; writes DIR/env (K8S_SERVER, tokens, CA)
#   scripts/k8s-api.sh stop DIR          stop them (controller manager first), by PID
# Cache: ${FAULTWATCH_K8S_CACHE:-~/.cache/faultwatch/k8s}/v$K8S_VERSION (binaries ~250 MB;
# Go's module and build caches ~4 GB). First build on 2 cores: ~8 min; cached: instant.
# CRDs: KEDA's ScaledObject and TriggerAuthentication exactly as KEDA publishes them
# (config/crd/bases of github.com/kedacore/keda/v2 at $KEDA_VERSION, fetched from the Go
# module proxy: a 3 MB module zip), cached in ${FAULTWATCH_K8S_CACHE:-~/.cache/faultwatch/k8s}/crds.
set -euo pipefail
K8S_VERSION=${FAULTWATCH_K8S_VERSION:-1.37.2}
KEDA_VERSION=${FAULTWATCH_KEDA_VERSION:-2.21.0}
KUBEFLOW_VERSION=${FAULTWATCH_KUBEFLOW_VERSION:-1.8.1}  # training-operator (PyTorchJob)
STAGING_VERSION="0.${K8S_VERSION#1.}"
ROOT=${FAULTWATCH_K8S_CACHE:-$HOME/.cache/faultwatch/k8s}
CACHE=$ROOT/v$K8S_VERSION
BIN=$CACHE/bin
CRDS=$ROOT/crds/keda-v$KEDA_VERSION
KEDA_CRDS="keda.sh_scaledobjects.yaml keda.sh_triggerauthentications.yaml"

log() { echo "k8s-api: $*" >&2; }

crds() {
  local f missing=""
  for f in $KEDA_CRDS; do [ -s "$CRDS/$f" ] || missing=1; done
  if [ -n "$missing" ]; then
    command -v go >/dev/null || { log "go is required to fetch KEDA's CRDs (Go module proxy)"; exit 1; }
    local dir
    dir=$(cd / && GOFLAGS=-mod=mod GOTOOLCHAIN=local \
      go mod download -json "github.com/kedacore/keda/v2@v$KEDA_VERSION" \
      | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
    [ -n "$dir" ] || { log "could not fetch github.com/kedacore/keda/v2@v$KEDA_VERSION"; exit 1; }
    mkdir -p "$CRDS"
    for f in $KEDA_CRDS; do cp "$dir/config/crd/bases/$f" "$CRDS/$f.tmp" && mv "$CRDS/$f.tmp" "$CRDS/$f"; done
    chmod u+w "$CRDS"/*.yaml
    log "KEDA v$KEDA_VERSION CRDs in $CRDS"
  fi
  echo "$CRDS"
}

kubeflow() {  # ~2 min the first time (the module and its dependencies), then instant
  local dir=$ROOT/kubeflow-v$KUBEFLOW_VERSION
  if [ ! -x "$dir/kfexit" ]; then
    command -v go >/dev/null || { log "go is required to build kfexit (Go toolchain)"; exit 1; }
    mkdir -p "$dir/src"
    cat > "$dir/src/main.go" <<'GO'
// kfexit CODE...: "CODE true|false" per code, from the training-operator's own
// IsRetryableExitCode (what a PyTorchJob with restartPolicy: ExitCode retries).
package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/kubeflow/training-operator/pkg/util/train"
)

func main() {
	for _, a := range os.Args[1:] {
		c, err := strconv.Atoi(a)
		if err != nil {
			fmt.Fprintln(os.Stderr, "not a code:", a)
			os.Exit(2)
		}
		fmt.Printf("%d %v\n", c, train.IsRetryableExitCode(int32(c)))
	}
}
GO
    printf 'module faultwatch.invalid/kfexit\n\ngo 1.22\n\nrequire github.com/kubeflow/training-operator v%s\n' \
      "$KUBEFLOW_VERSION" > "$dir/src/go.mod"
    (cd "$dir/src" && export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local \
      && go mod tidy >&2 && go build -o "$dir/kfexit.tmp" . >&2)
    mv "$dir/kfexit.tmp" "$dir/kfexit"
    log "kfexit (training-operator v$KUBEFLOW_VERSION) in $dir"
  fi
  echo "$dir/kfexit"
}

build() {
  crds >/dev/null
  kubeflow >/dev/null
  if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/etcd" ] && [ -x "$BIN/kube-controller-manager" ]; then
    echo "$BIN"; return
  fi
  command -v go >/dev/null || { log "go is required to build kube-apiserver (Go toolchain)"; exit 1; }
  local src=$CACHE/src start=$SECONDS
  mkdir -p "$src/apiserver" "$src/etcd" "$src/controller-manager" "$BIN"
  cd "$src"
  export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local
  local mod
  mod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "module faultwatch.invalid/k8s"
    echo
    echo "go 1.24"
    echo
    echo "require k8s.io/kubernetes v$K8S_VERSION"
    echo
    echo "replace ("
    sed -n '/^replace (/,/^)/p' "$mod" | sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\t\1 => \1 v'"$STAGING_VERSION"'#p'
    echo ")"
  } > go.mod
  cat > apiserver/main.go <<'GO'
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
GO
  cat > controller-manager/main.go <<'GO'
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() { os.Exit(cli.Run(app.NewControllerManagerCommand())) }
GO
  cat > etcd/main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  log "resolving modules (k8s.io/kubernetes v$K8S_VERSION)"
  go mod tidy >&2
  local v=k8s.io/component-base/version minor=${K8S_VERSION#1.}; minor=${minor%%.*}
  local ld="-s -w -X $v.gitVersion=v$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor"
  for b in etcd apiserver controller-manager; do
    local out=$b; [ "$b" = apiserver ] && out=kube-apiserver
    [ "$b" = controller-manager ] && out=kube-controller-manager
    log "building $out"
    go build -trimpath -ldflags "$ld" -o "$BIN/$out.tmp" "./$b" >&2
    mv "$BIN/$out.tmp" "$BIN/$out"
  done
  log "built in $((SECONDS - start)) s into $BIN"
  echo "$BIN"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

wait_for() {  # wait_for SECONDS CMD...: run CMD until it succeeds
  local until=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $until ] || return 1
    sleep 0.2
  done
}

start() {
  local dir=${1:?state directory}
  local bin; bin=$(build)
  command -v openssl >/dev/null || { log "openssl is required"; exit 1; }
  mkdir -p "$dir/pki" "$dir/etcd"; dir=$(cd "$dir" && pwd)
  local pki=$dir/pki
  # a CA, a serving certificate for 127.0.0.1, service-account keys
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=faultwatch-test-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' > "$pki/san.ext"
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -days 2 -extfile "$pki/san.ext" -out "$pki/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  local admin_token; admin_token=$(openssl rand -hex 24)
  # token users: an admin (system:masters); service accounts get tokens from the TokenRequest API
  ( umask 077; echo "$admin_token,faultwatch-admin,faultwatch-admin,\"system:masters\"" > "$pki/tokens.csv" )
  local etcd_port peer_port api_port
  etcd_port=$(free_port); peer_port=$(free_port); api_port=$(free_port)
  "$bin/etcd" --name fw --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "fw=http://127.0.0.1:$peer_port" --log-level warn > "$dir/etcd.log" 2>&1 &
  echo $! > "$dir/etcd.pid"
  wait_for 30 curl -sf "http://127.0.0.1:$etcd_port/health" || { log "etcd did not start: $dir/etcd.log"; exit 1; }
  "$bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --secure-port "$api_port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc \
    --authorization-mode RBAC --token-auth-file "$pki/tokens.csv" \
    --service-cluster-ip-range 10.96.0.0/16 --enable-priority-and-fairness=false \
    > "$dir/apiserver.log" 2>&1 &
  echo $! > "$dir/apiserver.pid"
  local server=https://127.0.0.1:$api_port
  wait_for 90 curl -sf --cacert "$pki/ca.crt" -H "Authorization: Bearer $admin_token" "$server/readyz" \
    || { log "kube-apiserver did not become ready: $dir/apiserver.log"; exit 1; }
  cat > "$dir/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: fw, cluster: {server: "$server", certificate-authority: "$pki/ca.crt"}}]
users: [{name: admin, user: {token: "$admin_token"}}]
contexts: [{name: fw, context: {cluster: fw, user: admin}}]
current-context: fw
KC
  chmod 600 "$dir/kubeconfig"
  # the controller manager: the disruption controller computes PodDisruptionBudget status
  # (without it every eviction of a PDB-covered pod answers 429), plus namespaces, service
  # accounts, and the Job controller (it applies the podFailurePolicy of deploy/'s Job).
  "$bin/kube-controller-manager" --kubeconfig "$dir/kubeconfig" --leader-elect=false \
    --controllers disruption,namespace,serviceaccount,garbagecollector,job \
    --secure-port 0 --service-account-private-key-file "$pki/sa.key" \
    --root-ca-file "$pki/ca.crt" > "$dir/controller-manager.log" 2>&1 &
  echo $! > "$dir/controller-manager.pid"
  ( umask 077; cat > "$dir/env" <<ENV
K8S_SERVER=$server
K8S_CA=$pki/ca.crt
K8S_ADMIN_TOKEN=$admin_token
K8S_KUBECONFIG=$dir/kubeconfig
ENV
  )
  log "kube-apiserver v$K8S_VERSION ready at $server (state in $dir)"
  echo "$server"
}

stop_pid() {
  local f=$1
  [ -f "$f" ] || return 0
  local pid; pid=$(cat "$f")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

stop() {  # the controller manager first: the apiserver waits for its connections on SIGTERM
  local dir=${1:?state directory}
  stop_pid "$dir/controller-manager.pid"
  stop_pid "$dir/apiserver.pid"
  stop_pid "$dir/etcd.pid"
}

case "${1:-}" in
  build) build ;;
  crds) crds ;;
  kubeflow) kubeflow ;;
  start) start "${2:-}" ;;
  stop) stop "${2:-}" ;;
  *) echo "usage: $0 build|crds|kubeflow|start DIR|stop DIR" >&2; exit 2 ;;
esac
