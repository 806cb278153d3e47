#!/usr/bin/env bash
# The whole suite at once on a 2-core machine: the e2e tests in E2E_WORKERS pytest-xdist
# worker processes (default 2; whole files per worker, so a module's fleet is started once),
# and beside them the pure and component tests (CPU-bound, about 90 s of one core). The e2e
# tests mostly wait on the real clusters, so the cores stay busy: the wall time is about
# the busier e2e worker's. Each worker enters its own private network namespace and starts
# its own session fleet (tests/fixtures.py), so the workers share nothing but the disk.
# With arguments, one plain pytest run with them (a developer's selection).
#
# Usage: hack/run-tests.sh [PYTEST_ARGS...]   (PATH must reach the venv's pytest)
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ $# -gt 0 ]]; then
  exec pytest "$@"
fi

workers="${E2E_WORKERS:-2}"
fast_log="$(mktemp -t tensile-fast-tests.XXXXXX)"
trap 'rm -f "${fast_log}"' EXIT

pytest tests/unit tests/component >"${fast_log}" 2>&1 &
fast=$!
pytest --numprocesses="${workers}" --dist=loadfile tests/e2e
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
