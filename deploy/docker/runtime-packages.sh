#!/usr/bin/env bash
# Prints the Debian/Ubuntu packages that own the shared libraries a binary
# loads (one a line, sorted), so that a container's runtime stage installs
# exactly those and no -dev packages. Run in the builder stage:
#
#   deploy/docker/runtime-packages.sh /usr/local/bin/kvserve > packages.txt
#
# Libraries that no package owns (the CUDA toolkit's, which the CUDA runtime
# base image already carries) are listed on stderr and skipped.
set -euo pipefail
binary="${1:?usage: runtime-packages.sh BINARY}"
missing=$(ldd "$binary" | grep 'not found' || true)
if [ -n "$missing" ]; then
  echo "runtime-packages: unresolved libraries of $binary:" >&2
  echo "$missing" >&2
  exit 1
fi
owner() {
  # dpkg records a library under /lib or /usr/lib depending on the package
  # (merged /usr): try the path ldd printed, its resolved path, and both
  # with and without the /usr prefix.
  local lib="$1" real
  real=$(readlink -f "$lib")
  for p in "$lib" "$real" "${lib#/usr}" "/usr$lib" "${real#/usr}" "/usr$real"; do
    if out=$(dpkg-query -S "$p" 2>/dev/null); then
      echo "${out%%:*}"
      return 0
    fi
  done
  return 1
}
ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
  while read -r lib; do
    owner "$lib" || echo "runtime-packages: no package owns $lib" >&2
  done | sort -u
