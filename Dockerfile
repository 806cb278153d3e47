# One image for tensile's programs: virtual-node, tensile-webhook, tensile-descheduler and
# tensile-scheduler are all on its PATH; a pod names the one it runs in `command` (as the
# chart and manifests/ do). `make image` builds it (hack/build-image.sh, docs/install.md).
#
# Two stages. The build stage is Debian 12 (bookworm) with Python from Debian's own
# packages, so the same file builds on Docker Hub's debian:bookworm-slim and on a Debian
# root filesystem made locally by mmdebstrap (hack/build-image.sh, for machines that reach
# no container registry). Pin it by digest when you build for production:
#   --build-arg BASE_IMAGE=docker.io/library/debian:bookworm-slim@sha256:<digest>
# The final image starts from nothing: the interpreter, the libraries it and the venv's
# extension modules load (the Debian packages they come in, listed in its
# /var/lib/dpkg/status) and the venv, assembled by hack/image-rootfs.py. No shell, no
# package manager, no pip, no compiler.
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${BASE_IMAGE} AS build
# The python3 and python3-venv of Debian 12's release (3.11); the interpreter's own
# packages follow Debian's security updates.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3=3.11.2-1+b1 python3-venv=3.11.2-1+b1 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The package's files (pyproject.toml, README.md, the constraints, the Python packages);
# the root filesystem's assembly comes in later, so changing it reuses the installed venv.
COPY pyproject.toml README.md ./
COPY hack/image-constraints.txt hack/
COPY tensile tensile/
COPY vnode vnode/
COPY webhook webhook/
COPY descheduler descheduler/
COPY scheduler scheduler/
COPY kubectl_tensile kubectl_tensile/
COPY devcluster devcluster/
# The commit `--version` prints (tensile/serving/version.py reads it from its COMMIT line;
# an image has no git checkout to ask).
ARG TENSILE_COMMIT=""
RUN if [ -n "${TENSILE_COMMIT}" ] && [ -f tensile/serving/version.py ]; then \
      sed -i "s/^COMMIT = \"\"$/COMMIT = \"${TENSILE_COMMIT}\"/" tensile/serving/version.py; \
    fi
# Exact dependency versions (hack/image-constraints.txt), installed by a pip that lives
# beside the venv (in /opt/pip, left in this stage) into a venv that has none. Where PyPI
# is reached through a TLS-intercepting proxy, its CA comes in as a build secret, never
# into a layer: `--secret id=ca-bundle,src=<PEM file>` (hack/build-image.sh passes
# $PIP_CERT's).
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi; \
    python3 -m venv --without-pip /opt/tensile \
 && python3 -m venv /opt/pip \
 && /opt/pip/bin/pip --python /opt/tensile/bin/python install --no-cache-dir \
      --disable-pip-version-check --constraint hack/image-constraints.txt .
# The final root filesystem in /rootfs; bytecode compiled now, as nothing can write it at
# run time on a read-only root.
COPY hack/image-rootfs.py hack/
RUN python3 hack/image-rootfs.py --venv /opt/tensile /rootfs python3.11-minimal libpython3.11-stdlib

FROM scratch
COPY --from=build /rootfs /
# Nothing is written below / at run time: no bytecode, logs on stdout/stderr, and what
# the programs keep (the virtual node's --cert-dir, the kubernetes client's temporary
# CA files in $TMPDIR) goes to volumes the pod mounts (the chart mounts emptyDirs at
# /var/lib/tensile and /tmp).
ENV PATH=/opt/tensile/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# 65532: the non-root user id the manifests and the chart run as (runAsNonRoot needs a
# numeric one to verify); /etc/passwd names it nonroot.
USER 65532:65532
WORKDIR /tmp
CMD ["virtual-node", "--help"]
