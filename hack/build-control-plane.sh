#!/usr/bin/env bash
# Build the local control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok, metrics-server), helm, promtool and virtual-kubelet's provider e2e
# suite from pinned Go module versions into a cache directory.
#
# Usage: hack/build-control-plane.sh [--only NAME] [BIN_DIR]
#   BIN_DIR defaults to ${TENSILE_CACHE_DIR:-~/.cache/tensile}/<kubernetes-version>/bin.
#   --only promtool builds that binary alone (`make lint` needs nothing else).
# Binaries already present are not rebuilt. Needs the `go` tool and the Go module proxy.
set -euo pipefail

only=""
if [[ "${1:-}" == "--only" ]]; then
  only="${2:?--only needs a name}"
  shift 2
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "${here}/versions.env"

cache_root="${TENSILE_CACHE_DIR:-${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.cache/tensile}"
bin_dir="${1:-${cache_root}/${KUBERNETES_VERSION}/bin}"
mkdir -p "${bin_dir}"
# One build at a time per cache: a second build (another checkout's test run, say) waits
# for the first and then finds everything built, instead of racing it for the same files.
if command -v flock >/dev/null 2>&1; then
  exec 9>"${bin_dir}/.build.lock"
  flock 9
fi

if ! command -v go >/dev/null 2>&1; then
  echo "error: the 'go' tool is not on PATH; install Go >= 1.26 (https://go.dev/doc/install)" >&2
  echo "       or set KUBEBUILDER_ASSETS to a directory holding etcd, kube-apiserver," >&2
  echo "       kube-controller-manager, kube-scheduler and kwok" >&2
  exit 2
fi

# What the harness needs next to the binaries: kwok's stage definitions (from the kwok
# module) and a stamp per binary naming the recipe it was built with, so a changed recipe
# rebuilds only what it touches.
# The kwok recipe names the version and a digest of the patch files (sorted by name), as
# devcluster/binaries.py computes it.
kwok_recipe="${KWOK_VERSION}+$(cat $(ls "${here}"/kwok-patch/* | LC_ALL=C sort) | sha256sum | cut -c1-16)"
# The e2e suite's recipe names the version and a digest of our wrapper test.
vk_e2e_recipe="${VIRTUAL_KUBELET_VERSION}+$(sha256sum < "${here}/vk-e2e/e2e_test.go" | cut -c1-16)"
# promtool's recipe names the version and the build tags.
promtool_recipe="${PROMETHEUS_VERSION}+${PROMTOOL_TAGS}"
stamp_ok() { [[ -x "${bin_dir}/$1" && "$(cat "${bin_dir}/$1.stamp" 2>/dev/null)" == "$2" ]]; }
stamp() { echo "$2" > "${bin_dir}/$1.stamp"; }

if [[ "${only}" == promtool ]]; then
  stamp_ok promtool "${promtool_recipe}" && exit 0
elif [[ -n "${only}" ]]; then
  echo "error: --only knows promtool, not ${only}" >&2
  exit 2
fi

have_all=1
stamp_ok promtool "${promtool_recipe}" || have_all=0
stamp_ok etcd "${ETCD_VERSION}" || have_all=0
stamp_ok kwok "${kwok_recipe}" || have_all=0
stamp_ok metrics-server "${METRICS_SERVER_VERSION}" || have_all=0
stamp_ok virtual-kubelet-e2e "${vk_e2e_recipe}" || have_all=0
stamp_ok helm "${HELM_VERSION}" || have_all=0
[[ -d "${bin_dir}/kwok-stages" ]] || have_all=0
for b in kube-apiserver kube-controller-manager kube-scheduler; do
  stamp_ok "${b}" "${KUBERNETES_VERSION}" || have_all=0
done
if [[ ${have_all} == 1 ]]; then
  echo "control plane ${KUBERNETES_VERSION} already built in ${bin_dir}"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
export GOFLAGS="-mod=mod -buildvcs=false"
export GOWORK=off
export CGO_ENABLED=0
# A toolchain download through the module proxy is fine if the local Go is older.
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"

k8s_minor="${KUBERNETES_VERSION#v1.}"; k8s_minor="${k8s_minor%%.*}"
staging_version="v0.${KUBERNETES_VERSION#v1.}"
version_pkg="k8s.io/component-base/version"
ldflags="-s -w \
 -X ${version_pkg}.gitVersion=${KUBERNETES_VERSION} \
 -X ${version_pkg}.gitMajor=1 -X ${version_pkg}.gitMinor=${k8s_minor} \
 -X ${version_pkg}.gitTreeState=clean \
 -X k8s.io/client-go/pkg/version.gitVersion=${KUBERNETES_VERSION} \
 -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=${k8s_minor}"

build_kubernetes() {
  local missing=0
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    stamp_ok "${b}" "${KUBERNETES_VERSION}" || missing=1
  done
  [[ ${missing} == 1 ]] || return 0
  local mod="${work}/kubernetes"
  mkdir -p "${mod}"
  cd "${mod}"
  go mod init tensile.local/controlplane >/dev/null 2>&1
  # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with
  # local paths, which a dependent module cannot see: replace each with its release.
  local info gomod
  # `go mod download` exits non-zero on an error it also reports in the JSON: show that.
  info="$(go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}")" || true
  if grep -q '"Error"' <<<"${info}"; then
    echo "error: cannot download k8s.io/kubernetes@${KUBERNETES_VERSION} through the Go module proxy:" >&2
    grep '"Error"' <<<"${info}" >&2
    exit 1
  fi
  gomod="$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' <<<"${info}")"
  local staging
  staging="$(awk '/^replace \(/{r=1;next} r&&/^\)/{r=0} r&&/=> \.\/staging/{print $1}' "${gomod}")"
  go mod edit -require="k8s.io/kubernetes@${KUBERNETES_VERSION}"
  for m in ${staging}; do
    if grep -qE "^\s+${m} v0\.0\.0" "${gomod}"; then
      go mod edit -replace="${m}=${m}@${staging_version}"
    fi
  done
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  # -e: the kubernetes module graph names test-only packages no build of ours needs; the
  # log is shown if a build fails.
  go mod tidy -e >"${work}/kubernetes-tidy.log" 2>&1
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    stamp_ok "${b}" "${KUBERNETES_VERSION}" && continue
    echo "building ${b} ${KUBERNETES_VERSION} ..."
    go build -trimpath -ldflags "${ldflags}" -o "${bin_dir}/${b}.tmp" "k8s.io/kubernetes/cmd/${b}" || {
      echo "error: building ${b} failed; go mod tidy said:" >&2
      cat "${work}/kubernetes-tidy.log" >&2
      exit 1
    }
    mv "${bin_dir}/${b}.tmp" "${bin_dir}/${b}"
    stamp "${b}" "${KUBERNETES_VERSION}"
  done
}

build_etcd() {
  stamp_ok etcd "${ETCD_VERSION}" && return
  local mod="${work}/etcd"
  mkdir -p "${mod}"
  cd "${mod}"
  go mod init tensile.local/etcd >/dev/null 2>&1
  cat > main.go <<'GO'
// Command etcd runs the etcd server from its released server module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  go mod edit -require="go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
  go mod tidy >/dev/null
  echo "building etcd ${ETCD_VERSION} ..."
  go build -trimpath -ldflags "-s -w" -o "${bin_dir}/etcd.tmp" .
  mv "${bin_dir}/etcd.tmp" "${bin_dir}/etcd"
  stamp etcd "${ETCD_VERSION}"
}

build_kwok() {
  stamp_ok kwok "${kwok_recipe}" && [[ -d "${bin_dir}/kwok-stages" ]] && return
  local mod="${work}/kwok"
  mkdir -p "${mod}"
  cd "${mod}"
  go mod init tensile.local/kwok >/dev/null 2>&1
  go mod edit -require="sigs.k8s.io/kwok@${KWOK_VERSION}"
  cat > tools.go <<'GO'
//go:build tools

package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
GO
  go mod tidy >/dev/null
  # kwok's local exec loses the command's exit status (kubectl would always exit 1). Build
  # from a temporary copy of the module in which each exec path passes its error through a
  # helper of ours that keeps the status (hack/kwok-patch/).
  local orig
  orig="$(go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  cp -r "${orig}" "${mod}/kwok-src" && chmod -R u+w "${mod}/kwok-src"
  local server="${mod}/kwok-src/pkg/kwok/server"
  sed -i -f "${here}/kwok-patch/exec-exit-code.sed" \
    "${server}/debugging_exec.go" "${server}/debugging_exec_other.go"
  if [[ $(cat "${server}"/debugging_exec*.go | grep -c 'err = tensileExitCode(err)') != 2 ]]; then
    echo "error: the kwok ${KWOK_VERSION} exec sources no longer match the exit-code patch" >&2
    exit 1
  fi
  sed -i -f "${here}/kwok-patch/stdin-eof.sed" "${mod}/kwok-src/pkg/utils/exec/exec.go"
  if ! grep -q '_ = inPipe.Close()' "${mod}/kwok-src/pkg/utils/exec/exec.go"; then
    echo "error: the kwok ${KWOK_VERSION} exec sources no longer match the stdin patch" >&2
    exit 1
  fi
  cp "${here}/kwok-patch/zz_tensile_exitcode.go" "${server}/"
  go mod edit -replace="sigs.k8s.io/kwok=./kwok-src"
  go mod tidy >/dev/null
  echo "building kwok ${KWOK_VERSION} ..."
  go build -trimpath -ldflags "-s -w" -o "${bin_dir}/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok
  mv "${bin_dir}/kwok.tmp" "${bin_dir}/kwok"
  # The kwok binary embeds no lifecycle stages (only kwokctl does): keep the fast node
  # and pod stages of the same release beside it.
  local stages="${orig}/kustomize/stage"
  rm -rf "${bin_dir}/kwok-stages.tmp" && mkdir -p "${bin_dir}/kwok-stages.tmp"
  cp "${stages}/node/fast/node-initialize.yaml" \
     "${stages}/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
     "${stages}/pod/fast/pod-ready.yaml" "${stages}/pod/fast/pod-complete.yaml" \
     "${stages}/pod/fast/pod-delete.yaml" "${bin_dir}/kwok-stages.tmp/"
  chmod 0644 "${bin_dir}/kwok-stages.tmp/"*
  rm -rf "${bin_dir}/kwok-stages" && mv "${bin_dir}/kwok-stages.tmp" "${bin_dir}/kwok-stages"
  stamp kwok "${kwok_recipe}"
}

build_metrics_server() {
  stamp_ok metrics-server "${METRICS_SERVER_VERSION}" && return
  local mod="${work}/metrics-server"
  mkdir -p "${mod}"
  cd "${mod}"
  go mod init tensile.local/metrics-server >/dev/null 2>&1
  go mod edit -require="sigs.k8s.io/metrics-server@${METRICS_SERVER_VERSION}"
  cat > tools.go <<'GO'
//go:build tools

package tools

import _ "sigs.k8s.io/metrics-server/cmd/metrics-server"
GO
  go mod tidy >/dev/null
  echo "building metrics-server ${METRICS_SERVER_VERSION} ..."
  go build -trimpath -ldflags "-s -w" -o "${bin_dir}/metrics-server.tmp" \
    sigs.k8s.io/metrics-server/cmd/metrics-server
  mv "${bin_dir}/metrics-server.tmp" "${bin_dir}/metrics-server"
  stamp metrics-server "${METRICS_SERVER_VERSION}"
}

build_vk_e2e() {
  stamp_ok virtual-kubelet-e2e "${vk_e2e_recipe}" && return
  local mod="${work}/vk-e2e"
  mkdir -p "${mod}"
  cd "${mod}"
  go mod init tensile.local/vke2e >/dev/null 2>&1
  cp "${here}/vk-e2e/e2e_test.go" .
  go mod edit -require="github.com/virtual-kubelet/virtual-kubelet@${VIRTUAL_KUBELET_VERSION}"
  go mod tidy >/dev/null
  echo "building virtual-kubelet's e2e suite ${VIRTUAL_KUBELET_VERSION} ..."
  go test -c -trimpath -ldflags "-s -w" -o "${bin_dir}/virtual-kubelet-e2e.tmp" .
  mv "${bin_dir}/virtual-kubelet-e2e.tmp" "${bin_dir}/virtual-kubelet-e2e"
  stamp virtual-kubelet-e2e "${vk_e2e_recipe}"
}

build_helm() {
  stamp_ok helm "${HELM_VERSION}" && return
  local mod="${work}/helm"
  mkdir -p "${mod}"
  cd "${mod}"
  go mod init tensile.local/helm >/dev/null 2>&1
  go mod edit -require="helm.sh/helm/v3@${HELM_VERSION}"
  cat > tools.go <<'GO'
//go:build tools

package tools

import _ "helm.sh/helm/v3/cmd/helm"
GO
  go mod tidy >/dev/null
  # As helm's own release build: `helm version` says the pinned version, and `helm
  # template`/`lint` assume the Kubernetes minor of the client-go helm is built with
  # (not the 1.20 compiled in as a fallback, which a chart's kubeVersion would refuse).
  local k8s_minor_helm pkg=helm.sh/helm/v3
  k8s_minor_helm="$(go list -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2)"
  echo "building helm ${HELM_VERSION} ..."
  go build -trimpath -ldflags "-s -w -X ${pkg}/internal/version.version=${HELM_VERSION} \
    -X ${pkg}/pkg/chartutil.k8sVersionMajor=1 -X ${pkg}/pkg/chartutil.k8sVersionMinor=${k8s_minor_helm} \
    -X ${pkg}/pkg/lint/rules.k8sVersionMajor=1 -X ${pkg}/pkg/lint/rules.k8sVersionMinor=${k8s_minor_helm}" \
    -o "${bin_dir}/helm.tmp" "${pkg}/cmd/helm"
  mv "${bin_dir}/helm.tmp" "${bin_dir}/helm"
  stamp helm "${HELM_VERSION}"
}

build_promtool() {
  stamp_ok promtool "${promtool_recipe}" && return
  local mod="${work}/promtool"
  mkdir -p "${mod}"
  cd "${mod}"
  go mod init tensile.local/promtool >/dev/null 2>&1
  go mod edit -require="github.com/prometheus/prometheus@${PROMETHEUS_VERSION}"
  cat > tools.go <<'GO'
//go:build tools

package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
GO
  # No `go mod tidy`: it would fetch the modules of every build tag. `go build -mod=mod`
  # (GOFLAGS) adds only what cmd/promtool with PROMTOOL_TAGS imports.
  echo "building promtool ${PROMETHEUS_VERSION} ..."
  local pkg=github.com/prometheus/common/version
  go build -trimpath -tags "${PROMTOOL_TAGS}" -ldflags "-s -w -X ${pkg}.Version=${PROMETHEUS_VERSION}" \
    -o "${bin_dir}/promtool.tmp" github.com/prometheus/prometheus/cmd/promtool
  mv "${bin_dir}/promtool.tmp" "${bin_dir}/promtool"
  stamp promtool "${promtool_recipe}"
}

start=$(date +%s)
if [[ "${only}" == promtool ]]; then
  build_promtool
  echo "promtool ${PROMETHEUS_VERSION} built in ${bin_dir} in $(( $(date +%s) - start )) s"
  exit 0
fi
build_promtool
build_etcd
build_kwok
build_kubernetes
build_metrics_server
build_vk_e2e
build_helm
echo "control plane ${KUBERNETES_VERSION} built in ${bin_dir} in $(( $(date +%s) - start )) s"
