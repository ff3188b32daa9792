#!/usr/bin/env bash
# Builds etcd, kube-apiserver and kube-controller-manager — and, for the consumer cluster with a
# node, kube-scheduler, kubelet, kube-proxy and the pod sandbox program `pause` — from the official
# Go modules pinned in go.mod, once per version, into the cache directory. Prints that directory on
# stdout.
#
#   KBIND_CONTROLPLANE_DIR  overrides the cache directory
#                           (default: ${XDG_CACHE_HOME:-~/.cache}/kbind/controlplane/<version>)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=$(sed -n "s/^[[:space:]]*k8s.io\/kubernetes \(v[0-9.]*\)\(.*\)\?$/\1/p" "$here/go.mod" | head -n1)
[ -n "$version" ] || { echo "build.sh: cannot read the Kubernetes version from go.mod" >&2; exit 1; }
# The cache key includes a hash of go.mod/go.sum and the etcd main, so any change rebuilds.
key=$(cat "$here/build.sh" "$here/go.mod" "$here/go.sum" "$here/etcd/main.go" "$here/pause/main.go" | sha256sum | cut -c1-12)
out=${KBIND_CONTROLPLANE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kbind/controlplane/$version-$key}

# Parallel test processes may all ask at once: one builds, the others wait for it.
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9

commands=(
  etcd:./etcd
  pause:./pause
  kube-apiserver:k8s.io/kubernetes/cmd/kube-apiserver
  kube-controller-manager:k8s.io/kubernetes/cmd/kube-controller-manager
  kube-scheduler:k8s.io/kubernetes/cmd/kube-scheduler
  kubelet:k8s.io/kubernetes/cmd/kubelet
  kube-proxy:k8s.io/kubernetes/cmd/kube-proxy
)
built=true
for cmd in "${commands[@]}"; do
  [ -x "$out/${cmd%%:*}" ] || built=false
done
if $built; then
  echo "$out"
  exit 0
fi

command -v go >/dev/null || { echo "build.sh: Go is required to build the test control plane (apt-get install golang or see go.dev)" >&2; exit 1; }
mkdir -p "$out.tmp"
cd "$here"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
# The version every component reports (`/version`, the Node's kubeletVersion): a chart's
# `kubeVersion` constraint is checked against it.
minor=$(echo "$version" | cut -d. -f2)
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags="$ldflags -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
done
for cmd in "${commands[@]}"; do
  name=${cmd%%:*} pkg=${cmd#*:}
  echo "build.sh: building $name $version (first time only, a few minutes)..." >&2
  start=$SECONDS
  go build -trimpath -ldflags="$ldflags" -o "$out.tmp/$name" "$pkg"
  echo "build.sh: built $name in $((SECONDS - start))s" >&2
done
rm -rf "$out"
mv "$out.tmp" "$out"
echo "$out"
