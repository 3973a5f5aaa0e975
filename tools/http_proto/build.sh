#!/usr/bin/env bash
# Builds the two HTTP library prototypes into OUT_DIR (default
# build/http_proto): httplib_sse (Debian libcpp-httplib-dev) and beast_sse
# (Debian libboost-dev, header-only Beast). Not part of the CMake build: they
# exist only for tools/http_stream_loadtest.py's library comparison.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:-$HERE/../../build/http_proto}"
mkdir -p "$OUT"
CXX="${CXX:-g++}"
FLAGS=(-std=c++20 -O2 -g -Wall -pthread -I"$HERE")
$CXX "${FLAGS[@]}" "$HERE/httplib_sse.cc" -o "$OUT/httplib_sse" \
  $(pkg-config --cflags --libs cpp-httplib)
$CXX "${FLAGS[@]}" "$HERE/beast_sse.cc" -o "$OUT/beast_sse"
echo "built $OUT/httplib_sse $OUT/beast_sse"
