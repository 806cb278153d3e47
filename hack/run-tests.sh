#!/usr/bin/env bash
# The whole suite in two pytest processes at once: the pure and component tests (CPU-bound,
# about 80 s on one core) beside the e2e tests (which mostly wait on the real clusters), so
# both cores work and the warm suite's wall time is the e2e tests' plus a little.
# With arguments, one plain pytest run with them (a developer's selection).
#
# Usage: hack/run-tests.sh [PYTEST_ARGS...]   (PATH must reach the venv's pytest)
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ $# -gt 0 ]]; then
  exec pytest "$@"
fi

fast_log="$(mktemp -t tensile-fast-tests.XXXXXX)"
trap 'rm -f "${fast_log}"' EXIT

pytest tests/unit tests/component >"${fast_log}" 2>&1 &
fast=$!
pytest tests/e2e
e2e_status=$?
wait "${fast}"
fast_status=$?

echo
echo "=== tests/unit and tests/component (run beside the e2e tests) ==="
cat "${fast_log}"
if [[ ${fast_status} -ne 0 || ${e2e_status} -ne 0 ]]; then
  echo "FAILED: unit+component exit ${fast_status}, e2e exit ${e2e_status}" >&2
  exit 1
fi
