"""A program's check at start that it CAN keep the objects it must write in namespaces it
does not make (its leader-election Lease, a record ConfigMap), or a stop at once saying what
to do: without it, a missing namespace or a missing RBAC rule makes the program retry its
Lease forever after one warning and never become Ready.

For each such object, a read first: one that exists (a replica started after another made
it) is taken as it is, and nothing is sent that writes (a standby writes nothing at all);
one the identity may not read is a stop (the program needs to read it). For a missing one,
a dry-run create (`dryRun=All`: the apiserver authenticates, authorizes and admits it, and
stores nothing) says which case it is (a read cannot: a missing namespace and a missing
object both answer 404):

- accepted, or AlreadyExists: it can be written;
- NotFound: its namespace is missing; it is created (the namespace is named by the program's
  flags, whose defaults are tensile's: creating it is what an administrator would do, and
  harmless if someone else just did), labelled with the program that made it; if this
  identity may not create namespaces, stop with the command to run;
- Forbidden: RBAC lacks the rule; stop, naming the rule, the manifest that grants it, and
  the flags that choose another place.

A stop is `PreflightFailed` (a program exits 1 with its message). Other answers (a 5xx, an
unreachable apiserver) are raised as they are: they are not configuration. The descheduler
and the virtual node (with --leader-elect) run it before they compete for their Lease.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tensile.kube import errors
from tensile.kube.client import ApiClient
from tensile.kube.resources import CONFIG_MAPS, LEASES, NAMESPACES, Resource

logger = logging.getLogger(__name__)

MANAGED_BY = "app.kubernetes.io/managed-by"
"""The label naming the program on a namespace it created."""
Verdict = Literal["writable", "create-namespace", "forbidden"]


class PreflightFailed(Exception):
    """The program cannot keep an object it must write; the message says what to do."""


@dataclass(frozen=True, kw_only=True)
class Need:
    """One object a program must be able to create: its kind, namespace and name, and, for
    messages, the flags that choose them and the manifest that grants the rights."""

    kind: Literal["Lease", "ConfigMap"]
    namespace: str
    name: str
    flags: str
    """e.g. "--leader-elect-resource-namespace, or --leader-elect=false with one replica"."""
    manifest: str
    """The shipped RBAC that grants it, e.g. "manifests/descheduler/rbac.yaml"."""


def verdict(code: int) -> Verdict | None:
    """Return what the HTTP status of a dry-run create means (None: not configuration; the
    caller raises the error)."""
    if code in (200, 201, 409):
        return "writable"
    if code == 404:
        return "create-namespace"
    if code == 403:
        return "forbidden"
    return None


def forbidden_message(need: Need, answer: str) -> str:
    """Return what to do when the apiserver refuses `need` with 403 (`answer`: its message,
    which also tells a namespace being deleted from missing RBAC)."""
    plural = "leases" if need.kind == "Lease" else "configmaps"
    return (
        f"{answer}; this identity must be able to create {need.kind}s in namespace "
        f"{need.namespace} (the "
        f"{need.kind} {need.name}): grant create on {plural} there and get/update on "
        f"{plural}/{need.name} ({need.manifest} does), or choose with {need.flags}"
    )


def no_namespace_message(need: Need) -> str:
    """Return what to do when `need`'s namespace is missing and may not be created."""
    return (
        f"namespace {need.namespace} (of the {need.kind} {need.name}) does not exist and this "
        f"identity may not create it: kubectl create namespace {need.namespace} (or apply "
        f"{need.manifest}), or choose with {need.flags}"
    )


async def ensure_writable(client: ApiClient, needs: Sequence[Need], *, manager: str) -> None:
    """Make every one of `needs` writable (see the module docstring); a namespace created
    here carries the label `MANAGED_BY`=`manager` (the program's name). Raises
    PreflightFailed, errors.ApiError (other refusals), errors.ApiUnavailable."""
    for need in needs:
        code, answer = await _read(client, need)
        if code == 200:
            continue
        if verdict(code) != "forbidden":
            code, answer = await _dry_run(client, need)
        if verdict(code) == "create-namespace":
            await _create_namespace(client, need, manager=manager)
            code, answer = await _dry_run(client, need)
        if verdict(code) == "forbidden":
            raise PreflightFailed(forbidden_message(need, answer))


def _resource(need: Need) -> Resource:
    return LEASES if need.kind == "Lease" else CONFIG_MAPS


async def _read(client: ApiClient, need: Need) -> tuple[int, str]:
    """Return the HTTP status of a GET of `need` (200, 404 or 403) and the apiserver's
    message."""
    try:
        await client.request("GET", _resource(need).path(namespace=need.namespace, name=need.name))
    except (errors.NotFound, errors.Forbidden) as exc:
        return exc.code, exc.message
    return 200, ""


async def _dry_run(client: ApiClient, need: Need) -> tuple[int, str]:
    """Return the HTTP status of a dry-run create of `need` and the apiserver's message."""
    resource = _resource(need)
    body: dict[str, Any] = {
        "apiVersion": "coordination.k8s.io/v1" if need.kind == "Lease" else "v1",
        "kind": need.kind,
        "metadata": {"name": need.name, "namespace": need.namespace},
    }
    try:
        await client.request(
            "POST",
            resource.path(namespace=need.namespace),
            params={"dryRun": "All"},
            body=body,
        )
    except errors.ApiError as exc:
        if verdict(exc.code) is None:
            raise
        return exc.code, exc.message
    return 201, ""


async def _create_namespace(client: ApiClient, need: Need, *, manager: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": need.namespace, "labels": {MANAGED_BY: manager}},
    }
    try:
        await client.request("POST", NAMESPACES.path(), body=body)
    except errors.AlreadyExists:
        return
    except errors.Forbidden:
        raise PreflightFailed(no_namespace_message(need)) from None
    logger.warning(
        "created namespace %s for the %s %s: it did not exist", need.namespace, need.kind, need.name
    )
