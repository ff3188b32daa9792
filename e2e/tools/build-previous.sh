#!/usr/bin/env bash
# Builds kbind-schema-manager and kbind-syncer at the commit named in e2e/tools/previous-version,
# once per commit, into the cache (its own target directory, so that the current tree's build is
# never touched). Prints the directory holding the two binaries.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
commit=$(sed -n 's/^commit=//p' e2e/tools/previous-version)
[ -n "$commit" ] || { echo "build-previous.sh: no commit= in e2e/tools/previous-version" >&2; exit 1; }
out=${XDG_CACHE_HOME:-$HOME/.cache}/kbind/previous/$commit
built() { [ -x "$out/bin/kbind-schema-manager" ] && [ -x "$out/bin/kbind-syncer" ]; }
if built; then
  echo "$out/bin"
  exit 0
fi
mkdir -p "$out"
exec 9>"$out.lock"
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
  rm -rf "$out/src" "$out/bin"
  mkdir -p "$out/src"
  git archive "$commit" | tar -x -C "$out/src"
  (cd "$out/src" && cargo build --locked --quiet --target-dir "$out/target" \
    --bin kbind-schema-manager --bin kbind-syncer)
  mkdir -p "$out/bin.tmp"
  cp "$out/target/debug/kbind-schema-manager" "$out/target/debug/kbind-syncer" "$out/bin.tmp/"
  mv "$out/bin.tmp" "$out/bin"
  # Only the binaries are kept: the sources and the build are hundreds of MiB.
  rm -rf "$out/src" "$out/target"
fi
echo "$out/bin"
