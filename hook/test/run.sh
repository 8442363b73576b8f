#!/bin/sh
# Run one build's C tests (build/plain, build/asan, build/ubsan: hook-test and race-test; or the
# programs named after the build, e.g. build/tsan race-test); non-zero on any failure.
set -e
cd "$(dirname "$0")/.."
build="$1"
shift
programs="${*:-hook-test race-test}"
for program in $programs; do
	echo "== $build/$program"
	ASAN_OPTIONS=detect_leaks=0 "./$build/$program"
done
