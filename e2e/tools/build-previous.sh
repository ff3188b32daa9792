#!/usr/bin/env bash
# Builds kbind-schema-manager and kbind-syncer at a commit named in e2e/tools/previous-version,
# once per commit, into the cache (its own target directory, so that the current tree's build is
# never touched). Prints the directory holding the two binaries.
#
#   e2e/tools/build-previous.sh             the version-skew tests' commit (`commit=`)
#   e2e/tools/build-previous.sh chart       the chart upgrade test's commit (`chart_commit=`)
#
# The binaries are statically linked (glibc, crt-static, as scripts/images builds them), so the
# same build runs as a process and as the only file of a `FROM scratch` image.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
case "${1:-}" in
  "") key=commit ;;
  chart) key=chart_commit ;;
  *) echo "build-previous.sh: unknown version '$1' (none, or chart)" >&2; exit 2 ;;
esac
commit=$(sed -n "s/^$key=//p" e2e/tools/previous-version)
[ -n "$commit" ] || { echo "build-previous.sh: no $key= in e2e/tools/previous-version" >&2; exit 1; }
out=${XDG_CACHE_HOME:-$HOME/.cache}/kbind/previous/$commit
built() { [ -x "$out/bin/kbind-schema-manager" ] && [ -x "$out/bin/kbind-syncer" ]; }
if built; then
  echo "$out/bin"
  exit 0
fi
mkdir -p "$out"
# One lock for every previous version: they build in one target directory (below), and a build
# copies its binaries out of it before the next may start.
exec 9>"$(dirname "$out")/build.lock"
flock 9
if ! built; then
  echo "build-previous.sh: building kbind at ${commit:0:12} (first time only, a few minutes)..." >&2
  if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
    git fetch --quiet origin "$commit" 2>/dev/null || true
  fi
  if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "build-previous.sh: commit $commit is not in this clone (a shallow clone?); fetch it or deepen the clone" >&2
    exit 1
  fi
  case "$(uname -m)" in
    x86_64) triple=x86_64-unknown-linux-gnu ;;
    aarch64) triple=aarch64-unknown-linux-gnu ;;
    *) echo "build-previous.sh: unsupported architecture $(uname -m)" >&2; exit 1 ;;
  esac
  rustflags_var="CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_RUSTFLAGS"
  rm -rf "$out/src" "$out/bin"
  mkdir -p "$out/src"
  git archive "$commit" | tar -x -C "$out/src"
  # The dev profile without debug info: quick to build, the same code.
  # One target directory for every previous version: their dependencies are (nearly) the same
  # crates, compiled once for all of them.
  target=$(dirname "$out")/target
  (cd "$out/src" && env "$rustflags_var=-C target-feature=+crt-static" CARGO_PROFILE_DEV_DEBUG=false \
    cargo build --locked --quiet --target "$triple" --target-dir "$target" \
    --bin kbind-schema-manager --bin kbind-syncer)
  mkdir -p "$out/bin.tmp"
  cp "$target/$triple/debug/kbind-schema-manager" "$target/$triple/debug/kbind-syncer" "$out/bin.tmp/"
  mv "$out/bin.tmp" "$out/bin"
  rm -rf "$out/src"
  # Only the binaries are kept: the build is hundreds of MiB, gone once every previous version
  # named in previous-version is built.
  all_built=true
  for k in commit chart_commit; do
    c=$(sed -n "s/^$k=//p" e2e/tools/previous-version)
    [ -z "$c" ] || [ -x "$(dirname "$out")/$c/bin/kbind-syncer" ] || all_built=false
  done
  if $all_built; then rm -rf "$target"; fi
fi
echo "$out/bin"
