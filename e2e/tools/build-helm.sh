#!/usr/bin/env bash
# Builds Helm from its official Go module, once per version, into the cache. Prints its path.
set -euo pipefail
version=v3.22.0
out=${XDG_CACHE_HOME:-$HOME/.cache}/kbind/tools/helm-$version
if [ -x "$out/helm" ]; then
  echo "$out/helm"
  exit 0
fi
command -v go >/dev/null || { echo "build-helm.sh: Go is required to build Helm" >&2; exit 1; }
mkdir -p "$out"
exec 9>"$out.lock"
flock 9
if [ ! -x "$out/helm" ]; then
  echo "build-helm.sh: building helm $version (first time only, a few minutes)..." >&2
  CGO_ENABLED=0 GOBIN="$out" GOFLAGS=-mod=mod go install -trimpath -ldflags='-s -w' "helm.sh/helm/v3/cmd/helm@$version"
fi
echo "$out/helm"
