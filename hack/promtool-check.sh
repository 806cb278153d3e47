#!/usr/bin/env bash
# Prometheus's own checks of tensile's alerts and dashboards, with promtool built from the
# pinned Prometheus module (hack/build-control-plane.sh --only promtool):
#   - `promtool check rules` on charts/tensile/files/alerts.yaml (syntax, templates, lint);
#   - every dashboard expression (charts/tensile/files/dashboards/*.json) as a recording
#     rule of a temporary rule file, so promtool parses each one;
#   - `promtool test rules` on tests/alerts/*.yaml, the alerts' unit tests.
#
# Usage: hack/promtool-check.sh [PROMTOOL]
#   PROMTOOL defaults to the build cache's promtool. PYTHON (default python3) extracts the
#   dashboards' expressions.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "${here}")"
# shellcheck source=versions.env
source "${here}/versions.env"
cache_root="${TENSILE_CACHE_DIR:-${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.cache/tensile}"
promtool="${1:-${KUBEBUILDER_ASSETS:+${KUBEBUILDER_ASSETS}/promtool}}"
if [[ -z "${promtool}" || ! -x "${promtool}" ]]; then
  promtool="${cache_root}/${KUBERNETES_VERSION}/bin/promtool"
fi
if [[ ! -x "${promtool}" ]]; then
  echo "error: ${promtool} not found: run hack/build-control-plane.sh --only promtool" >&2
  exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

cd "${root}"
"${promtool}" check rules charts/tensile/files/alerts.yaml

# Grafana's $__rate_interval stands where a duration goes; other variables ($node) only
# inside label values, which promtool takes as they are.
"${PYTHON:-python3}" - "${work}/dashboards.rules.yaml" charts/tensile/files/dashboards/*.json <<'PY'
import json
import sys

out, *boards = sys.argv[1:]
groups = []
for path in boards:
    board = json.load(open(path))
    rules = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "5m")
            rules.append({"record": f"dashboard:panel_{panel['id']}_{target['refId']}", "expr": expr})
    groups.append({"name": path, "rules": rules})
# JSON is YAML: promtool reads it as a rule file.
json.dump({"groups": groups}, open(out, "w"), indent=1)
PY
"${promtool}" check rules --lint=none "${work}/dashboards.rules.yaml"

"${promtool}" test rules tests/alerts/*.yaml
