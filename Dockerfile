# One image for tensile's programs: virtual-node, tensile-webhook, tensile-descheduler and
# (where that package is present) tensile-scheduler are all on its PATH; a pod names the
# one it runs in `command` (as the chart and manifests/ do). `make image` builds it
# (hack/build-image.sh, docs/install.md).
#
# The base is Debian 12 (bookworm) with Python from Debian's own packages, so the same file
# builds on Docker Hub's debian:bookworm-slim and on a Debian root filesystem made locally
# by mmdebstrap (hack/build-image.sh, for machines that reach no container registry).
# Pin it by digest when you build for production:
#   --build-arg BASE_IMAGE=docker.io/library/debian:bookworm-slim@sha256:<digest>
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${BASE_IMAGE} AS build
# The python3 and python3-venv of Debian 12's release (3.11); the interpreter's own
# packages follow Debian's security updates.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3=3.11.2-1+b1 python3-venv=3.11.2-1+b1 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# What .dockerignore lets through: pyproject.toml, README.md, the constraints and the
# Python packages.
COPY . .
# The commit `--version` prints (tensile/serving/version.py reads it from its COMMIT line;
# an image has no git checkout to ask).
ARG TENSILE_COMMIT=""
RUN if [ -n "${TENSILE_COMMIT}" ] && [ -f tensile/serving/version.py ]; then \
      sed -i "s/^COMMIT = \"\"$/COMMIT = \"${TENSILE_COMMIT}\"/" tensile/serving/version.py; \
    fi
# Exact dependency versions (hack/image-constraints.txt); bytecode compiled now, as
# nothing can write it at run time on a read-only root filesystem. Where PyPI is reached
# through a TLS-intercepting proxy, its CA comes in as a build secret, never into a layer:
# `--secret id=ca-bundle,src=<PEM file>` (hack/build-image.sh passes $PIP_CERT's).
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi; \
    python3 -m venv /opt/tensile \
 && /opt/tensile/bin/pip install --no-cache-dir --disable-pip-version-check \
      --constraint hack/image-constraints.txt . \
 && /opt/tensile/bin/python -m compileall -q /opt/tensile

FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3=3.11.2-1+b1 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/tensile /opt/tensile
# Nothing is written below / at run time: no bytecode, logs on stdout/stderr, and what
# the programs keep (the virtual node's --cert-dir, the kubernetes client's temporary
# CA files in $TMPDIR) goes to volumes the pod mounts (the chart mounts emptyDirs at
# /var/lib/tensile and /tmp).
ENV PATH=/opt/tensile/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# 65532: the non-root user id the manifests and the chart run as (runAsNonRoot needs a
# numeric one to verify).
USER 65532:65532
WORKDIR /tmp
CMD ["virtual-node", "--help"]
