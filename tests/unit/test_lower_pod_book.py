"""The k2k provider's bookkeeping of lower pods (`LowerPodBook`): writes in flight,
vanished pods, and the capacity the other pods take."""

from __future__ import annotations

from typing import Any

import pytest

from tensile.contracts import ownership
from vnode.providers.k2k import capacity
from vnode.providers.k2k.lowerpods import LowerPodBook, Write

OWNER = ownership.NodeIdentity(node_name="vn-1", cluster_id="c-1")
OTHER = ownership.NodeIdentity(node_name="vn-2", cluster_id="c-1")
NODE = {
    "metadata": {"name": "n1"},
    "status": {
        "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True"}],
    },
}


def lower_pod(
    name: str = "p",
    *,
    uid: str = "u-1",
    owner: ownership.NodeIdentity | None = OWNER,
    cpu: str = "1",
    node: str | None = "n1",
) -> dict[str, Any]:
    labels, annotations = ownership.owner_marks(owner) if owner else ({}, {})
    if owner:
        annotations = {**annotations, ownership.UPPER_UID_ANNOTATION: uid}
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"lower-{name}",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
        },
        "status": {"phase": "Running"},
    }


def cpu_free(book: LowerPodBook) -> str:
    return capacity.node_resources(book.free([NODE]))["cpu"]


def test_a_create_is_in_flight_until_the_informer_shows_the_pod() -> None:
    book = LowerPodBook(owner=OWNER)
    book.create_sent(upper_uid="u-1", lower_key="ns/p")
    assert book.writing(upper_uid="u-1")
    assert book.writing(lower_key="ns/p")
    assert book.in_flight(upper_uid="u-1") == Write(
        verb="create", upper_uid="u-1", lower_key="ns/p"
    )
    book.created("u-1", lower_uid="lower-p")
    assert book.writing(upper_uid="u-1"), "the POST's answer is not the informer's view"
    book.seen(lower_pod())
    assert not book.writing(upper_uid="u-1")
    assert not book.writing(lower_key="ns/p")
    assert book.writes() == []


def test_a_refused_create_is_no_longer_in_flight() -> None:
    book = LowerPodBook(owner=OWNER)
    book.create_sent(upper_uid="u-1", lower_key="ns/p")
    book.create_refused("u-1")
    assert book.in_flight(upper_uid="u-1") is None


def test_a_pod_of_another_name_does_not_end_a_create() -> None:
    book = LowerPodBook(owner=OWNER)
    book.create_sent(upper_uid="u-1", lower_key="ns/q")
    book.seen(lower_pod("p", uid="u-1"))
    assert book.writing(lower_key="ns/q")


def test_another_tenants_pod_does_not_end_a_create() -> None:
    book = LowerPodBook(owner=OWNER)
    book.create_sent(upper_uid="u-1", lower_key="ns/p")
    book.seen(lower_pod("p", uid="u-1", owner=OTHER))
    assert book.writing(upper_uid="u-1")


def test_a_delete_is_in_flight_until_the_pod_is_gone_and_then_it_did_not_vanish() -> None:
    book = LowerPodBook(owner=OWNER)
    book.delete_sent(upper_uid="u-1", lower_key="ns/p")
    assert book.in_flight(lower_key="ns/p") == Write(
        verb="delete", upper_uid="u-1", lower_key="ns/p"
    )
    book.seen(lower_pod())  # still terminating
    assert book.writing(upper_uid="u-1")
    book.gone(lower_pod())
    assert not book.writing(upper_uid="u-1")
    assert not book.vanished("u-1")


def test_a_pod_of_ours_gone_without_our_delete_vanished_until_it_is_made_again() -> None:
    book = LowerPodBook(owner=OWNER)
    book.seen(lower_pod())
    book.gone(lower_pod())
    assert book.vanished("u-1")
    assert not book.vanished("u-2")
    book.create_sent(upper_uid="u-1", lower_key="ns/p")
    assert book.vanished("u-1"), "only a create that got through makes it new"
    book.created("u-1", lower_uid="lower-p")
    assert not book.vanished("u-1")


def test_another_tenants_pod_never_vanishes() -> None:
    book = LowerPodBook(owner=OWNER)
    book.gone(lower_pod(owner=OTHER))
    assert not book.vanished("u-1")


def test_a_delete_is_answered_before_a_create_for_the_same_pod() -> None:
    book = LowerPodBook(owner=OWNER)
    book.create_sent(upper_uid="u-1", lower_key="ns/p")
    book.delete_sent(upper_uid="u-1", lower_key="ns/p")
    found = book.in_flight(upper_uid="u-1")
    assert found is not None
    assert found.verb == "delete"
    assert [w.verb for w in book.writes()] == ["delete", "create"]


def test_the_deletion_of_the_created_pod_ends_both_writes() -> None:
    book = LowerPodBook(owner=OWNER)
    book.create_sent(upper_uid="u-1", lower_key="ns/p")
    book.delete_sent(upper_uid="u-1", lower_key="ns/p")
    book.gone(lower_pod())
    assert book.writes() == []


def test_a_delete_answered_gone_is_no_longer_in_flight() -> None:
    # The informer showed the deletion before the DELETE was answered 404: no event will
    # end the write, the answer does.
    book = LowerPodBook(owner=OWNER)
    book.delete_sent(upper_uid="u-1", lower_key="ns/p")
    book.delete_answered_gone("u-1")
    assert book.writes() == []


def test_forgetting_a_deleted_upper_pod_drops_its_writes_and_its_vanished_mark() -> None:
    # A create whose POST was answered 5xx stays in flight; the upper pod is then deleted
    # with no lower pod cached: nothing of it may stay in the book for good.
    book = LowerPodBook(owner=OWNER)
    book.gone(lower_pod(uid="u-2", name="q"))
    book.create_sent(upper_uid="u-1", lower_key="ns/p")
    book.delete_sent(upper_uid="u-1", lower_key="ns/p")
    assert book.vanished("u-2")
    book.forget("u-1")
    book.forget("u-2")
    assert book.writes() == []
    assert not book.vanished("u-2")


def test_a_pod_whose_delete_was_answered_gone_did_not_vanish_when_the_informer_shows_it() -> None:
    # Someone deleted it just before our DELETE (404); the informer shows it only after the
    # upper pod is gone for good: a vanished mark then would stay forever.
    book = LowerPodBook(owner=OWNER)
    book.delete_sent(upper_uid="u-1", lower_key="ns/p")
    book.delete_answered_gone("u-1")
    assert book.writes() == []
    book.gone(lower_pod(uid="u-2", name="q"))  # another pod's deletion does not end it
    assert book.vanished("u-2")
    book.gone(lower_pod(uid="u-1", name="p"))
    assert not book.vanished("u-1")
    book.forget("u-2")
    assert book.remembered() == 0


@pytest.mark.parametrize(
    ("pods", "free"),
    [
        ([], "4"),
        ([lower_pod("a", owner=None)], "3"),
        ([lower_pod("a", owner=OTHER), lower_pod("b", owner=None, cpu="500m")], "2500m"),
        ([lower_pod("a")], "4"),  # ours: the upper node counts it, not the room below
        ([lower_pod("a", owner=None, node=None)], "4"),  # not bound: holds nothing
    ],
)
def test_the_capacity_counts_the_pods_that_are_not_ours(
    pods: list[dict[str, Any]], free: str
) -> None:
    book = LowerPodBook(owner=OWNER)
    for pod in pods:
        book.seen(pod)
    assert cpu_free(book) == free


def test_seen_and_gone_tell_when_the_capacity_moved() -> None:
    book = LowerPodBook(owner=OWNER)
    other = lower_pod("a", owner=None)
    assert book.seen(other)
    assert not book.seen(other), "the same requests again: nothing moved"
    assert book.seen(lower_pod("a", owner=None, cpu="2"))
    assert cpu_free(book) == "2"
    assert book.gone(other)
    assert cpu_free(book) == "4"
    assert not book.gone(other)
    assert not book.seen(lower_pod("b"))
    assert not book.gone(lower_pod("b"))


def test_a_pod_that_becomes_ours_stops_counting() -> None:
    book = LowerPodBook(owner=OWNER)
    book.seen(lower_pod("a", owner=None))
    assert book.seen(lower_pod("a"))
    assert cpu_free(book) == "4"


def test_a_malformed_quantity_is_not_counted() -> None:
    book = LowerPodBook(owner=OWNER)
    book.seen(lower_pod("a", owner=None))
    assert book.seen(lower_pod("a", owner=None, cpu="lots"))
    assert cpu_free(book) == "4"


@pytest.mark.parametrize(
    ("events", "creating"),
    [
        ([], False),
        (["create_sent"], True),
        (["create_sent", "created"], True),  # answered, not shown yet: it exists below
        (["create_sent", "create_refused"], False),
        (["create_sent", "seen"], False),
        (["create_sent", "gone"], False),
        (["create_sent", "delete_sent"], True),  # a delete is not the create's outcome
        (["create_sent", "forget"], False),
    ],
)
def test_a_create_is_in_doubt_until_refused_shown_or_forgotten(
    events: list[str], creating: bool
) -> None:
    book = LowerPodBook(owner=OWNER)
    for event in events:
        if event == "create_sent":
            book.create_sent(upper_uid="u-1", lower_key="ns/p")
        elif event == "delete_sent":
            book.delete_sent(upper_uid="u-1", lower_key="ns/p")
        elif event == "seen":
            book.seen(lower_pod())
        elif event == "gone":
            book.gone(lower_pod())
        elif event == "created":
            book.created("u-1", lower_uid="lower-p")
        else:
            getattr(book, event)("u-1")
    expected = Write(verb="create", upper_uid="u-1", lower_key="ns/p") if creating else None
    assert book.creating("u-1") == expected


def forged(name: str = "p", *, uid: str = "u-1", lower_uid: str) -> dict[str, Any]:
    """A lower pod at the node's key with the node's marks copied onto it by someone else."""
    pod = lower_pod(name, uid=uid)
    pod["metadata"]["uid"] = lower_uid
    return pod


@pytest.mark.parametrize(
    ("story", "made_by_node"),
    [
        # The create's answer names the pod: a pod of another UID at the key is not it.
        ("answered", False),
        # A start: the informer's first sight of a pod of ours is the node's record.
        ("first sight", False),
        # The node's create landed and the informer shows it before the answer.
        ("landed", False),
        # The node deleted its pod: the next pod of ours at the key is a new record.
        ("deleted by the node", True),
        # The upper pod is forgotten: nothing of it is remembered.
        ("forgotten", True),
    ],
)
def test_a_pod_with_copied_marks_after_the_nodes_own_is_not_the_nodes(
    story: str, made_by_node: bool
) -> None:
    book = LowerPodBook(owner=OWNER)
    own = lower_pod()
    if story == "answered":
        book.create_sent(upper_uid="u-1", lower_key="ns/p")
        book.created("u-1", lower_uid="lower-p")
        book.seen(own)
    elif story == "first sight":
        book.seen(own)
    elif story == "landed":
        book.create_sent(upper_uid="u-1", lower_key="ns/p")
        book.seen(own)
        book.created("u-1", lower_uid="lower-p")
    assert book.made(own)
    if story == "deleted by the node":
        book.seen(own)
        book.delete_sent(upper_uid="u-1", lower_key="ns/p")
        book.gone(own)
    elif story == "forgotten":
        book.seen(own)
        book.forget("u-1")
    else:
        book.gone(own)  # someone else deleted it
        assert book.vanished("u-1")
    impostor = forged(lower_uid="someone-elses")
    book.seen(impostor)
    assert book.made(impostor) is made_by_node
    assert book.ours(impostor)  # the marks alone say so; only the record tells
    if not made_by_node:
        # Its deletion is not another vanishing, and the node's own pod stays the record.
        book.gone(impostor)
        assert book.vanished("u-1")
        assert not book.made(forged(lower_uid="yet-another"))


def test_no_record_outlives_its_upper_pod() -> None:
    book = LowerPodBook(owner=OWNER)
    book.seen(lower_pod())
    assert book.remembered() == 1
    book.forget("u-1")
    assert book.remembered() == 0
