#!/usr/bin/env bash
# The Kubernetes "real tier" (issue #24): kube-apiserver, etcd and kwok built from their Go modules
# into $K8S_BED (default ~/.cache/remote-exec/k8s-bed): bin/ holds the binaries, go/ the module and
# build caches. A wrapper module per binary (src/*/go.mod) pins the release: k8s.io/kubernetes
# v1.35.4 with each staging module replaced by its v0.35.4 (k8s.io/kubernetes requires them at
# v0.0.0: kubernetes#79384), go.etcd.io/etcd/server/v3 v3.6.16, sigs.k8s.io/kwok v0.8.0.
# Measured on 2 cores at nice 19: cold ~11 min (apiserver 7.5, etcd 1, kwok 2.5) and 4.5 GB of
# caches; warm (nothing changed): seconds. Needs go >= 1.25 and the Go module proxy.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bed=${K8S_BED:-${XDG_CACHE_HOME:-$HOME/.cache}/remote-exec/k8s-bed}
mkdir -p "$bed/bin" "$bed/go"
export GOPATH=$bed/go GOMODCACHE=$bed/go/pkg/mod GOCACHE=$bed/go/cache GOTOOLCHAIN=local
export GOFLAGS="-p=${GO_JOBS:-1} -buildvcs=false -mod=mod"
export PATH=/usr/local/go/bin:$PATH
command -v go >/dev/null || { echo "k8s-bed: go is not installed" >&2; exit 1; }
V=k8s.io/component-base/version
build() { # dir, binary, package, [ldflags]
  local start; start=$(date +%s)
  (cd "$here/src/$1" && nice -n 19 go build -trimpath -ldflags="-s -w ${4:-}" -o "$bed/bin/$2.new" "$3")
  mv "$bed/bin/$2.new" "$bed/bin/$2"
  echo "k8s-bed: $2 built in $(( $(date +%s) - start )) s"
}
build kube kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver \
  "-X $V.gitVersion=v1.35.4 -X $V.gitMajor=1 -X $V.gitMinor=35 -X $V.gitTreeState=clean -X $V.buildDate=2026-01-01T00:00:00Z"
build etcd etcd go.etcd.io/etcd/server/v3
build kwok kwok sigs.k8s.io/kwok/cmd/kwok
echo "k8s-bed: $bed/bin"
