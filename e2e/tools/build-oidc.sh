#!/usr/bin/env bash
# Builds the OpenID Connect provider the gateway's login is tested against, once per version,
# into the cache, and prints its path: the example server of zitadel/oidc (an OpenID-certified
# Go library), a real provider — discovery, authorization code with PKCE, a login form, signed ID
# tokens, userinfo — with its users and clients in memory (users from USERS_FILE, redirect URIs
# from REDIRECT_URI, port from PORT).
set -euo pipefail
version=v3.52.0
out=${XDG_CACHE_HOME:-$HOME/.cache}/kbind/tools/oidc-$version
if [ -x "$out/server" ]; then
  echo "$out/server"
  exit 0
fi
command -v go >/dev/null || { echo "build-oidc.sh: Go is required to build the OIDC provider" >&2; exit 1; }
mkdir -p "$out"
exec 9>"$out.lock"
flock 9
if [ ! -x "$out/server" ]; then
  echo "build-oidc.sh: building zitadel/oidc's provider $version (first time only, a minute)..." >&2
  CGO_ENABLED=0 GOBIN="$out" GOFLAGS=-mod=mod go install -trimpath -ldflags='-s -w' \
    "github.com/zitadel/oidc/v3/example/server@$version"
fi
echo "$out/server"
