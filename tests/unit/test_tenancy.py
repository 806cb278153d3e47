"""Ownership marks, lower namespaces of tenants and the Pod Security Standards (pure, and
LowerNamespaces against a fake lower apiserver)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tensile.contracts import ownership
from tensile.contracts.labels import is_label_value
from tensile.kube.resources import NAMESPACES
from tensile.kube.workqueue import Requeue
from vnode.providers.k2k import naming, podsecurity
from vnode.providers.k2k.namespaces import LowerNamespaces, terminating
from vnode.testing.fakeapi import FakeApi

A = ownership.NodeIdentity(
    node_name="virtual-kubelet", cluster_id="aaaaaaaa-0000-4000-8000-000000000001"
)
B = ownership.NodeIdentity(
    node_name="virtual-kubelet", cluster_id="bbbbbbbb-0000-4000-8000-000000000002"
)


def namespace(name: str, *, owner: ownership.NodeIdentity | None, upper: str) -> dict[str, Any]:
    labels, annotations = (
        ownership.namespace_marks(owner=owner, upper_namespace=upper) if owner else ({}, {})
    )
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations}}


def test_marks_name_node_and_cluster_and_select_only_their_owner() -> None:
    labels, annotations = ownership.owner_marks(A)
    obj = {"metadata": {"labels": labels, "annotations": annotations}}
    assert ownership.is_owned(obj, owner=A)
    assert not ownership.is_owned(obj, owner=B)
    assert ownership.owner_selector(A) == (
        f"{ownership.NODE_LABEL}=virtual-kubelet,{ownership.CLUSTER_LABEL}={A.cluster_id}"
    )
    assert (
        ownership.owner_of(obj)
        == f"owned by virtual node virtual-kubelet of upper cluster {A.cluster_id}"
    )
    assert ownership.owner_of({"metadata": {}}) == "not managed by tensile"


def test_label_values_that_are_not_valid_are_hashed() -> None:
    assert ownership.label_value("eu-west.prod_1") == "eu-west.prod_1"
    for text in ("x" * 64, "with space", "-dash", "ünicode"):
        value = ownership.label_value(text)
        assert value.startswith("h-")
        assert is_label_value(value)


def test_namespaces_without_a_prefix_are_shared() -> None:
    theirs = namespace("shared", owner=B, upper="shared")
    assert naming.namespace_conflict(theirs, owner=A, upper_namespace="shared", prefix="") is None


def test_prefixed_namespaces_belong_to_one_cluster_and_one_upper_namespace() -> None:
    ours = namespace("t1-x-y", owner=A, upper="x-y")
    assert naming.namespace_conflict(ours, owner=A, upper_namespace="x-y", prefix="t1-") is None
    # t1- + x-y and t1-x- + y map to the same name: the second is refused.
    collision = naming.namespace_conflict(ours, owner=A, upper_namespace="y", prefix="t1-x-")
    assert collision is not None
    assert "created for upper namespace x-y" in collision
    other = naming.namespace_conflict(ours, owner=B, upper_namespace="x-y", prefix="t1-")
    assert other is not None
    assert f"belongs to upper cluster {A.cluster_id}" in other
    unmarked = namespace("t1-x-y", owner=None, upper="x-y")
    problem = naming.namespace_conflict(unmarked, owner=A, upper_namespace="x-y", prefix="t1-")
    assert problem is not None
    assert "not created by tensile" in problem


def test_mapped_namespace_names_must_stay_valid() -> None:
    assert naming.namespace_problem("a" * 60, prefix="t1-") is None
    problem = naming.namespace_problem("a" * 61, prefix="t1-")
    assert problem is not None
    assert "at most 63 characters" in problem


def pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "team"},
        "spec": {"containers": [{"name": "app", "image": "busybox"}], **spec},
    }


def restricted_pod() -> dict[str, Any]:
    return pod(
        securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        containers=[
            {
                "name": "app",
                "image": "busybox",
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                },
            }
        ],
        volumes=[{"name": "c", "configMap": {"name": "c"}}, {"name": "e", "emptyDir": {}}],
    )


def test_a_plain_pod_is_baseline_and_a_hardened_one_restricted() -> None:
    assert podsecurity.violations(pod(), level="baseline") == []
    assert podsecurity.violations(restricted_pod(), level="restricted") == []
    assert podsecurity.violations(restricted_pod(), level="baseline") == []
    reasons = podsecurity.violations(pod(), level="restricted")
    assert any("allowPrivilegeEscalation" in r for r in reasons)
    assert any("runAsNonRoot" in r for r in reasons)
    assert any("seccompProfile" in r for r in reasons)
    assert any("drop ALL" in r for r in reasons)


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"hostNetwork": True}, "host namespaces (hostNetwork=true)"),
        ({"hostPID": True}, "host namespaces (hostPID=true)"),
        (
            {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
            'hostPath volumes (volume "root")',
        ),
        (
            {
                "containers": [
                    {"name": "app", "image": "x", "securityContext": {"privileged": True}}
                ]
            },
            'privileged (container "app")',
        ),
        (
            {
                "initContainers": [
                    {
                        "name": "init",
                        "image": "x",
                        "securityContext": {"capabilities": {"add": ["SYS_ADMIN", "CHOWN"]}},
                    }
                ]
            },
            "non-default capabilities (SYS_ADMIN)",
        ),
        (
            {
                "containers": [
                    {"name": "app", "image": "x", "ports": [{"containerPort": 80, "hostPort": 80}]}
                ]
            },
            "hostPort (80)",
        ),
        ({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}, "seccompProfile"),
        (
            {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}},
            "kernel.msgmax",
        ),
        ({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}, "seLinuxOptions"),
        ({"securityContext": {"windowsOptions": {"hostProcess": True}}}, "hostProcess"),
    ],
)
def test_baseline_refuses_the_known_escalations(spec: dict[str, Any], reason: str) -> None:
    reasons = podsecurity.violations(pod(**spec), level="baseline")
    assert any(reason in r for r in reasons), reasons
    assert podsecurity.violations(pod(**spec), level="privileged") == []


def test_unconfined_apparmor_is_refused() -> None:
    confined = pod()
    confined["metadata"]["annotations"] = {
        "container.apparmor.security.beta.kubernetes.io/app": "runtime/default"
    }
    assert podsecurity.violations(confined, level="baseline") == []
    confined["metadata"]["annotations"] = {
        "container.apparmor.security.beta.kubernetes.io/app": "unconfined"
    }
    assert podsecurity.violations(confined, level="baseline")


def test_restricted_volume_types_and_root() -> None:
    hardened = restricted_pod()
    hardened["spec"]["volumes"].append({"name": "n", "nfs": {"server": "192.0.2.1", "path": "/"}})
    hardened["spec"]["securityContext"]["runAsUser"] = 0
    reasons = podsecurity.violations(hardened, level="restricted")
    assert "restricted volume types (nfs)" in reasons
    assert "runAsUser=0" in reasons


def test_malformed_pods_do_not_crash_the_check() -> None:
    for spec in ({"containers": "x"}, {"securityContext": []}, {"volumes": [1, None]}):
        podsecurity.violations({"spec": spec}, level="restricted")
    podsecurity.violations({}, level="restricted")


# -- lower namespaces being deleted ------------------------------------------------------------


def being_deleted(lower: FakeApi) -> None:
    """Lower namespace "ns" is being deleted (until `gone`)."""
    lower.put(
        NAMESPACES,
        {
            "metadata": {"name": "ns", "deletionTimestamp": "2030-01-01T00:00:00Z"},
            "status": {"phase": "Terminating"},
        },
    )


def gone(lower: FakeApi) -> None:
    """Lower namespace "ns" is gone at last."""
    lower.remove(NAMESPACES, "ns")


def lower_api(answer: asyncio.Event | None = None) -> FakeApi:
    """A lower apiserver whose namespace "ns" is being deleted (the e2e test in test_tenancy
    holds a real one; this one checks the timing of the looks, and how many requests keys
    that come together send). Each answer waits a turn of the loop, then for `answer` if
    given, so requests are in flight while other keys come."""
    lower = FakeApi(name="lower")
    lower.delay(seconds=0, until=answer)
    being_deleted(lower)
    return lower


def methods(lower: FakeApi) -> list[str]:
    return [r.method for r in lower.requests]


async def test_objects_of_a_lower_namespace_being_deleted_wait_with_doubling_looks() -> None:
    now = [100.0]
    lower = lower_api()
    namespaces = LowerNamespaces(
        lower=lower,
        owner=A,
        prefix="",
        pod_security_level="baseline",
        clock=lambda: now[0],
    )

    async def requeued() -> float:
        with pytest.raises(Requeue) as waited:
            await namespaces.ensure("ns", source_namespace="ns")
        return waited.value.after

    assert await requeued() == 1.0
    assert methods(lower) == ["POST", "GET"]
    now[0] += 0.25
    assert await requeued() == 0.75  # not due: no request
    assert namespaces.going("ns").after == 0.75  # a refusal meanwhile is the same look
    assert methods(lower) == ["POST", "GET"]
    for expected in (2.0, 4.0, 8.0, 10.0, 10.0):
        now[0] += 10.0
        assert await requeued() == expected
    gone(lower)
    now[0] += 10.0
    await namespaces.ensure("ns", source_namespace="ns")  # made again
    calls = len(methods(lower))
    await namespaces.ensure("ns", source_namespace="ns")
    assert len(methods(lower)) == calls  # known now
    # A create refused later (NamespaceTerminating): forgotten, and looked at from 1 s again.
    assert namespaces.going("ns").after == 1.0
    being_deleted(lower)
    now[0] += 1.0
    assert await requeued() == 2.0


async def test_keys_waiting_for_a_lower_namespace_being_deleted_share_each_look() -> None:
    """500 pods of a namespace being deleted below, due at the same moment: one look
    (POST + GET) per look time, not one per pod, and all get its answer."""
    now = [100.0]
    lower = lower_api()
    namespaces = LowerNamespaces(
        lower=lower,
        owner=A,
        prefix="",
        pod_security_level="baseline",
        clock=lambda: now[0],
    )

    async def burst() -> list[BaseException | None]:
        return await asyncio.gather(
            *(namespaces.ensure("ns", source_namespace="ns") for _ in range(500)),
            return_exceptions=True,
        )

    def waits(results: list[BaseException | None]) -> set[float]:
        assert all(isinstance(result, Requeue) for result in results), results[:3]
        return {result.after for result in results if isinstance(result, Requeue)}

    assert waits(await burst()) == {1.0}
    assert methods(lower) == ["POST", "GET"]
    now[0] += 1.0
    assert waits(await burst()) == {2.0}  # all due together: still one look
    assert methods(lower) == ["POST", "GET"] * 2
    gone(lower)
    now[0] += 2.0
    assert await burst() == [None] * 500  # made again, once
    assert methods(lower) == ["POST", "GET"] * 2 + ["POST"]


async def test_a_look_cut_short_leaves_the_keys_that_waited_for_it_to_look_again() -> None:
    answer = asyncio.Event()
    lower = lower_api(answer)
    gone(lower)
    namespaces = LowerNamespaces(lower=lower, owner=A, prefix="", pod_security_level="baseline")
    first = asyncio.create_task(namespaces.ensure("ns", source_namespace="ns"), name="first")
    await asyncio.sleep(0)
    second = asyncio.create_task(namespaces.ensure("ns", source_namespace="ns"), name="second")
    try:
        await asyncio.sleep(0)
        assert methods(lower) == ["POST"]
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        answer.set()
        await second  # not cancelled with the look it waited for: looked itself
        assert methods(lower) == ["POST", "POST"]
    finally:
        answer.set()
        for task in (first, second):
            task.cancel()
        await asyncio.gather(first, second, return_exceptions=True)


def test_what_looks_found_is_forgotten_once_nothing_waits_for_the_namespace() -> None:
    now = [100.0]
    namespaces = LowerNamespaces(
        lower=lower_api(),
        owner=A,
        prefix="",
        pod_security_level="baseline",
        clock=lambda: now[0],
    )
    for name in ("kept", "left"):
        assert namespaces.going(name).after == 1.0
    now[0] += 1.0
    assert namespaces.going("kept").after == 2.0  # its keys came back: the delay doubles
    now[0] += 21.0
    assert namespaces.going("kept").after == 4.0
    # Nobody came back for "left" for 20 s past its look: forgotten, not kept for ever,
    assert set(namespaces._going) == {"kept"}
    # and a pod that comes for it later starts from the first delay.
    assert namespaces.going("left").after == 1.0


def test_a_namespace_is_terminating_by_its_phase_or_deletion_timestamp() -> None:
    assert terminating({"status": {"phase": "Terminating"}})
    assert terminating({"metadata": {"deletionTimestamp": "2030-01-01T00:00:00Z"}})
    assert not terminating({"metadata": {"name": "ns"}, "status": {"phase": "Active"}})
