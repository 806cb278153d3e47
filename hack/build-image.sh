#!/usr/bin/env bash
# Build tensile's image (the Dockerfile at the repository's root) with whatever builder
# this machine has: docker (with a running daemon), podman, or buildah (daemonless, from
# Debian's packages), then its SBOM (CycloneDX JSON, made by syft from the built image: the
# Debian packages of its /var/lib/dpkg/status and the Python packages of its venv) beside
# it. Prints the image's name last.
#
# Usage: hack/build-image.sh
#   IMAGE       the name to give it (default tensile/tensile:<version in pyproject.toml>)
#   BASE_IMAGE  the base (default: the Dockerfile's, debian:bookworm-slim from Docker Hub),
#               e.g. debian:bookworm-slim@sha256:<digest> to pin it. Set to `mmdebstrap`
#               (the default when mmdebstrap is installed and the builder is buildah):
#               build the base here, a minimal Debian 12 root filesystem from Debian's
#               package mirror (DEBIAN_MIRROR, default http://deb.debian.org/debian),
#               for machines that reach no container registry; it is made once and
#               reused (`buildah rmi localhost/tensile-base:bookworm` to make it again).
#   BUILDER     docker, podman or buildah, to choose when several are installed.
#   PIP_CERT    a CA bundle (PEM) for pip inside the build, where PyPI is reached through a
#               TLS-intercepting proxy: passed as a build secret, kept out of the image.
#   SBOM        where to write the SBOM (default dist/tensile-<version>.cdx.json); `none`:
#               make none. syft is built once from its pinned Go module (SYFT_VERSION below)
#               into the tools cache (needs `go`), or taken from $SYFT.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)"
image="${IMAGE:-tensile/tensile:${version}}"
commit="$(git rev-parse --short=12 HEAD 2>/dev/null || true)"

pick_builder() {
  if [[ -n "${BUILDER:-}" ]]; then
    echo "${BUILDER}"
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    echo docker
  elif command -v podman >/dev/null 2>&1; then
    echo podman
  elif command -v buildah >/dev/null 2>&1; then
    echo buildah
  fi
}
builder="$(pick_builder)"
if [[ -z "${builder}" ]]; then
  echo "error: no image builder here: install one of docker (with its daemon running)," >&2
  echo "       podman or buildah (Debian: apt-get install buildah mmdebstrap)" >&2
  exit 2
fi

buildah_() {
  # chroot isolation: RUN steps work as root inside a container or sandbox, where an OCI
  # runtime's namespaces are often refused (STORAGE_DRIVER=vfs where overlay is too).
  BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-chroot}" buildah "$@"
}

base="${BASE_IMAGE:-}"
if [[ -z "${base}" && "${builder}" == buildah ]] && command -v mmdebstrap >/dev/null 2>&1; then
  base=mmdebstrap
fi
if [[ "${base}" == mmdebstrap ]]; then
  base=localhost/tensile-base:bookworm
  if ! buildah_ inspect --type image "${base}" >/dev/null 2>&1; then
    mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
    work="$(mktemp -d)"
    trap 'rm -rf "${work}"' EXIT
    echo "making the base ${base} with mmdebstrap from ${mirror} ..."
    # minbase (what debian:*-slim is) with its updates and security suites, without
    # documentation, manual pages and translations (as the slim images leave them out).
    mmdebstrap --variant=minbase --format=tar \
      --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      --dpkgopt='path-exclude=/usr/share/info/*' \
      bookworm "${work}/rootfs.tar" \
      "deb ${mirror} bookworm main" \
      "deb ${mirror} bookworm-updates main" \
      "deb ${mirror%/debian}/debian-security bookworm-security main"
    container="$(buildah_ from scratch)"
    buildah_ add "${container}" "${work}/rootfs.tar" /
    buildah_ config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --cmd bash "${container}"
    buildah_ commit --rm "${container}" "${base}"
  fi
fi

args=(--file Dockerfile --tag "${image}" --build-arg "TENSILE_COMMIT=${commit}")
[[ -n "${base}" ]] && args+=(--build-arg "BASE_IMAGE=${base}")
[[ -n "${PIP_CERT:-}" ]] && args+=(--secret "id=ca-bundle,src=${PIP_CERT}")
echo "building ${image} with ${builder}${base:+ on ${base}} ..."
case "${builder}" in
  docker) docker build "${args[@]}" . ;;
  podman) podman build "${args[@]}" . ;;
  buildah) buildah_ bud --layers "${args[@]}" . ;;
  *) echo "error: BUILDER must be docker, podman or buildah, not ${builder}" >&2; exit 2 ;;
esac

# The SBOM, from the image as built (an OCI or docker archive of it), with syft: Anchore's
# SBOM generator, maintained, reading both dpkg's status and Python's installed metadata.
SYFT_VERSION=v1.57.1
sbom="${SBOM:-dist/tensile-${version}.cdx.json}"
if [[ "${sbom}" != none ]]; then
  syft="${SYFT:-}"
  if [[ -z "${syft}" ]]; then
    tools="${TENSILE_CACHE_DIR:-${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.cache/tensile}/tools"
    syft="${tools}/syft-${SYFT_VERSION}/syft"
    if [[ ! -x "${syft}" ]] && ! command -v go >/dev/null 2>&1; then
      echo "error: the image ${image} is built, but its SBOM needs syft: install Go >= 1.26" >&2
      echo "       (syft is built from its Go module), set SYFT to a syft binary, or SBOM=none" >&2
      exit 2
    fi
    if [[ ! -x "${syft}" ]]; then
      echo "building syft ${SYFT_VERSION} from its Go module into ${syft%/syft} ..."
      GOFLAGS="-mod=mod -buildvcs=false" GOWORK=off CGO_ENABLED=0 GOBIN="${syft%/syft}" \
        go install -ldflags="-s -w" "github.com/anchore/syft/cmd/syft@${SYFT_VERSION}"
    fi
  fi
  archive_dir="$(mktemp -d)"
  case "${builder}" in
    docker) docker save -o "${archive_dir}/image.tar" "${image}"; source_="docker-archive:${archive_dir}/image.tar" ;;
    podman) podman save --format oci-archive -o "${archive_dir}/image.tar" "${image}"; source_="oci-archive:${archive_dir}/image.tar" ;;
    buildah) buildah_ push "${image}" "oci-archive:${archive_dir}/image.tar:${image}"; source_="oci-archive:${archive_dir}/image.tar" ;;
  esac
  mkdir -p "$(dirname "${sbom}")"
  SYFT_CHECK_FOR_APP_UPDATE=false "${syft}" scan "${source_}" --quiet \
    --source-name "${image%:*}" --source-version "${image##*:}" \
    --output "cyclonedx-json=${sbom}"
  rm -rf "${archive_dir}"
  echo "SBOM (CycloneDX) of ${image}: ${sbom}"
fi
echo "${image}"
