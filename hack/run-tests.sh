#!/usr/bin/env bash
# The whole suite at once on a 2-core machine: the e2e tests in E2E_WORKERS pytest-xdist
# worker processes (default 3: they mostly wait on the clusters, and a third worker took
# the e2e run from about 16.7 to 13.3 minutes; whole files per worker, so a module's fleet
# is started once, longest files first), and beside them the pure and component tests (CPU-bound, about 90 s of one core). The e2e
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

workers="${E2E_WORKERS:-3}"

# inotify instances: every kube-apiserver of a fleet holds 6 and every controller-manager 5
# (certificate and configuration file watches), and kwok takes one more for each `kubectl
# logs -f` or `attach` it serves. Three workers' session fleets plus one test's own fleet
# come to about 190, and the kernel's default limit per user is 128: past it kwok fails
# with "failed to create fsnotify watcher: too many open files". So the limit is raised
# for the run where we may (root), and said; elsewhere a warning says what to do.
inotify_limit=/proc/sys/fs/inotify/max_user_instances
wanted=$((256 * workers))
if [[ -r ${inotify_limit} ]] && (($(cat "${inotify_limit}") < wanted)); then
  if [[ -w ${inotify_limit} ]]; then
    echo "raising fs.inotify.max_user_instances from $(cat "${inotify_limit}") to ${wanted} for ${workers} e2e workers" >&2
    echo "${wanted}" >"${inotify_limit}"
  else
    echo "warning: fs.inotify.max_user_instances is $(cat "${inotify_limit}"); ${workers} e2e workers want ${wanted} (sysctl -w fs.inotify.max_user_instances=${wanted}), or kwok may fail to serve logs and attach" >&2
  fi
fi
fast_log="$(mktemp -t tensile-fast-tests.XXXXXX)"
trap 'rm -f "${fast_log}"' EXIT

pytest tests/unit tests/component >"${fast_log}" 2>&1 &
fast=$!
# Files go to the workers in the order collected, which tests/e2e/timing.py makes longest
# first; xdist's own reordering (by number of tests) would undo that.
pytest --numprocesses="${workers}" --dist=loadfile --no-loadscope-reorder tests/e2e
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
