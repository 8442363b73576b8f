#!/bin/sh
# Run one build's C test (build/plain, build/asan or build/ubsan); non-zero on any failure.
set -e
cd "$(dirname "$0")/.."
echo "== $1"
ASAN_OPTIONS=detect_leaks=0 "./$1/hook-test"
