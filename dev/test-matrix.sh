#!/usr/bin/env bash
# `make test-matrix`: `make test` on each Kubernetes version given (the Makefile passes every
# version with controlplane/k8s/<version>/go.mod), one after the other. Each version's output
# goes to run/test-matrix/<version>.log; run/test-matrix/summary.txt gets one line per version
# (date, result, build and test time, pytest's closing line), which the README's
# supported-versions line quotes. Exits non-zero when any version failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=run/test-matrix
mkdir -p "$out"
[ $# -gt 0 ] || { echo "test-matrix: no versions given" >&2; exit 2; }
failed=()
echo "# make test-matrix, $(date -u +%Y-%m-%dT%H:%MZ), versions: $*" >> "$out/summary.txt"
for version in "$@"; do
  echo "=== test-matrix: Kubernetes $version ==="
  start=$(date +%s)
  make --no-print-directory controlplane K8S_VERSION="$version" 2>&1 | tee "$out/$version.log"
  built=$(date +%s)
  make --no-print-directory test K8S_VERSION="$version" PYTEST_ARGS="${PYTEST_ARGS:-}" 2>&1 | tee -a "$out/$version.log"
  status=${PIPESTATUS[0]}
  end=$(date +%s)
  closing=$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$out/$version.log" | tail -1)
  result=$([ "$status" = 0 ] && echo passed || echo FAILED)
  [ "$status" = 0 ] || failed+=("$version")
  line="$(date -u +%Y-%m-%d) $version $result build $((built - start)) s, test $((end - built)) s: ${closing:-no pytest summary}"
  echo "$line" >> "$out/summary.txt"
  echo "=== test-matrix: $line ==="
done
echo "=== test-matrix: summary (run/test-matrix/summary.txt) ==="
tail -n $# "$out/summary.txt"
[ ${#failed[@]} -eq 0 ] || { echo "test-matrix: failed on ${failed[*]}" >&2; exit 1; }
