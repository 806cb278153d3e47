"""What of an upper EndpointSlice crosses to the lower cluster (pure, as tables): the slice
only beside this upper cluster's copy of its very Service, an endpoint only as the IP of an
upper pod the Service selects, a selector-less Service's endpoints only when the
administrator names it; and the mirror's decisions that follow. The same on the real
clusters: tests/e2e/test_services.py (the tests after "what crosses with a Service's
endpoints")."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tensile.contracts import ownership
from tensile.contracts.objects import Obj, annotations_of, namespace_of
from tensile.kube.informer import Informer
from tensile.kube.mirror.decide import Create, Delete, Nothing, Update, UpToDate, decide
from tensile.kube.mirror.engine import Mirror
from tensile.kube.mirror.siblings import SiblingPolicy
from tensile.kube.mirror.spec import KindSpec, Patch
from tensile.kube.resources import ENDPOINT_SLICES
from vnode.providers.k2k import endpointslices, naming, services
from vnode.providers.k2k.endpointslices import Caches, Dropped, SelectorlessServices, Verdict

OWNER = ownership.NodeIdentity(node_name="vn-a", cluster_id="aaaaaaaa-0000-4000-8000-000000000001")
SIBLING = ownership.NodeIdentity(node_name="vn-b", cluster_id=OWNER.cluster_id)
OTHER_CLUSTER = ownership.NodeIdentity(node_name="vn-a", cluster_id="another-cluster")
TENANCY = naming.NodeTenancy(owner=OWNER, prefix="")
NONE_NAMED = SelectorlessServices()
CONTROLLER = "endpointslice-controller.k8s.io"


def upper_service(*, uid: str = "svc-1", selector: dict[str, str] | None = None) -> Obj:
    spec: dict[str, Any] = {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    if selector != {}:
        spec["selector"] = selector or {"app": "web"}
    return {"metadata": {"name": "web", "namespace": "app", "uid": uid}, "spec": spec}


def service_copy(owner: ownership.NodeIdentity = OWNER, *, of: Obj | None = None) -> Obj:
    return services.lower_service(of or upper_service(), owner=owner, prefix="")


THEIRS = {
    "metadata": {"name": "web", "namespace": "app", "uid": "lower-1", "labels": {}},
    "spec": {"selector": {"app": "theirs"}},
}
"""The lower cluster's own Service of the same name."""


def pod(name: str, *, labels: dict[str, str] | None = None, **status: Any) -> Obj:
    return {
        "metadata": {
            "name": name,
            "namespace": "app",
            "uid": f"uid-{name}",
            "labels": {"app": "web"} if labels is None else labels,
        },
        "status": status or {"podIPs": [{"ip": f"10.244.0.{len(name)}"}]},
    }


PODS = {
    "app/web-1": pod("web-1", podIPs=[{"ip": "10.244.1.5"}, {"ip": "fd00::5"}]),
    "app/web-2": pod("web-2", podIP="10.244.1.6"),
    "app/db-1": pod("db-1", labels={"app": "db"}, podIPs=[{"ip": "10.244.1.7"}]),
}


def caches(*, service: Obj | None = None, copy_: Obj | None = None) -> Caches:
    return Caches(
        upper_services={"app/web": service} if service is not None else {},
        service_copies={"app/web": copy_} if copy_ is not None else {},
        upper_pods=PODS,
    )


def ref(name: str, **extra: str) -> dict[str, str]:
    return {"kind": "Pod", "name": name, "namespace": "app", "uid": f"uid-{name}", **extra}


def endpoint(address: str, target: dict[str, str] | None = None, *more: str) -> dict[str, Any]:
    found: dict[str, Any] = {"addresses": [address, *more], "conditions": {"ready": True}}
    if target is not None:
        found["targetRef"] = target
    return found


GOOD = endpoint("10.244.1.5", ref("web-1"))


def upper_slice(*endpoints: dict[str, Any], manager: str = CONTROLLER, **labels: str) -> Obj:
    return {
        "metadata": {
            "name": "web-abcde",
            "namespace": "app",
            "uid": "s-1",
            "labels": {
                services.SERVICE_NAME_LABEL: "web",
                services.MANAGED_BY_LABEL: manager,
                **labels,
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
        "endpoints": list(endpoints) or [GOOD],
    }


def judge(slice_: Obj, view: Caches, named: SelectorlessServices = NONE_NAMED) -> Verdict:
    return endpointslices.judge(slice_, caches=view, tenancy=TENANCY, selectorless=named)


# -- whether the slice crosses: beside this upper cluster's copy of its very Service --------


def _service_cases() -> dict[str, tuple[Obj, Caches, bool]]:
    deleting = upper_service()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    no_label = upper_slice()
    del no_label["metadata"]["labels"][services.SERVICE_NAME_LABEL]
    return {
        "our copy of this Service": (
            upper_slice(),
            caches(service=upper_service(), copy_=service_copy()),
            True,
        ),
        "a sibling's copy of it": (
            upper_slice(),
            caches(service=upper_service(), copy_=service_copy(SIBLING)),
            True,
        ),
        # The traffic hijack: the Service copy was refused, the lower name is someone else's.
        "no copy below (the name is someone else's)": (
            upper_slice(),
            caches(service=upper_service()),
            False,
        ),
        "the lower cluster's own Service": (
            upper_slice(),
            caches(service=upper_service(), copy_=THEIRS),
            False,
        ),
        "another upper cluster's copy": (
            upper_slice(),
            caches(service=upper_service(), copy_=service_copy(OTHER_CLUSTER)),
            False,
        ),
        "our copy of an earlier Service of the name": (
            upper_slice(),
            caches(service=upper_service(uid="svc-2"), copy_=service_copy()),
            False,
        ),
        "the upper Service is gone": (upper_slice(), caches(copy_=service_copy()), False),
        "the upper Service is being deleted": (
            upper_slice(),
            caches(service=deleting, copy_=service_copy(of=deleting)),
            False,
        ),
        "no service-name label": (
            no_label,
            caches(service=upper_service(), copy_=service_copy()),
            False,
        ),
    }


@pytest.mark.parametrize(
    ("slice_", "view", "crosses"), list(_service_cases().values()), ids=list(_service_cases())
)
def test_a_slice_crosses_only_beside_this_clusters_copy_of_its_service(
    slice_: Obj, view: Caches, crosses: bool
) -> None:
    assert judge(slice_, view).crosses is crosses


def test_a_copy_whose_marks_are_forged_below_does_not_serve_without_the_upper_uid() -> None:
    """Marks below are anyone's to write who may write lower Services: the upper UID the
    node recorded is what ties the copy to this very upper Service."""
    forged = copy.deepcopy(service_copy())
    del forged["metadata"]["annotations"][ownership.UPPER_UID_ANNOTATION]
    assert not endpointslices.copy_serves(forged, upper_service=upper_service(), tenancy=TENANCY)
    assert endpointslices.copy_serves(
        service_copy(), upper_service=upper_service(), tenancy=TENANCY
    )


# -- which endpoints cross: IPs of upper pods the Service selects ---------------------------


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        # What the upper EndpointSlice controller writes: one endpoint per selected pod.
        (GOOD, None),
        (endpoint("fd00::5", ref("web-1")), None),  # the pod's other family
        (endpoint("10.244.1.5", ref("web-1"), "fd00::5"), None),
        (endpoint("10.244.1.6", ref("web-2")), None),  # status.podIP only (older servers)
        (endpoint("10.244.1.5", {"kind": "Pod", "name": "web-1"}), None),  # no uid, no namespace
        # Everything else, with why.
        (endpoint("10.244.1.5"), "its targetRef names no Pod"),
        (endpoint("10.244.1.5", {"kind": "Node", "name": "web-1"}), "its targetRef names no Pod"),
        (
            endpoint("10.244.1.5", ref("web-1", namespace="other")),
            "its targetRef names Pod other/web-1 of another namespace",
        ),
        (endpoint("10.244.1.9", ref("web-9")), "no running Pod web-9 upstairs"),
        (
            endpoint("10.244.1.5", ref("web-1", uid="earlier")),
            "Pod web-1 is not the one its targetRef names (another UID)",
        ),
        (endpoint("10.244.1.7", ref("db-1")), "the Service does not select Pod db-1"),
        (endpoint("169.254.169.254", ref("web-1")), "not an IP of Pod web-1"),
        (endpoint("10.244.1.5", ref("web-1"), "10.96.0.1"), "not an IP of Pod web-1"),
        (endpoint("10.244.1.6", ref("web-1")), "not an IP of Pod web-1"),  # another pod's
    ],
)
def test_an_endpoint_crosses_only_as_the_ip_of_a_pod_the_service_selects(
    given: dict[str, Any], reason: str | None
) -> None:
    verdict = judge(upper_slice(given), caches(service=upper_service(), copy_=service_copy()))
    assert verdict.crosses
    if reason is None:
        assert verdict.endpoints == (given,)
        assert verdict.dropped == ()
    else:
        assert verdict.endpoints == ()
        assert verdict.dropped == (Dropped(tuple(given["addresses"]), reason),)


def test_the_endpoints_that_cross_keep_their_order_and_the_copy_names_no_upper_pod() -> None:
    forged = endpoint("10.96.0.1")
    upper = upper_slice(GOOD, forged, endpoint("10.244.1.6", ref("web-2")))
    view = caches(service=upper_service(), copy_=service_copy())
    verdict = judge(upper, view)
    assert [e["addresses"] for e in verdict.endpoints] == [["10.244.1.5"], ["10.244.1.6"]]
    spec = endpointslices.slice_spec(
        tenancy=TENANCY, selection=services.ServiceSelection(), selectorless=NONE_NAMED, caches=view
    )
    lower = spec.translate(upper)
    assert lower["endpoints"] == [
        {"addresses": ["10.244.1.5"], "conditions": {"ready": True}},
        {"addresses": ["10.244.1.6"], "conditions": {"ready": True}},
    ]


# -- selector-less Services: only those the administrator names ---------------------------------

SELECTORLESS = "the Service has no selector and --selectorless-services does not name it"


@pytest.mark.parametrize(
    ("named", "crosses_as_written"),
    [
        (NONE_NAMED, False),
        (SelectorlessServices(names=frozenset({("app", "web")})), True),
        (SelectorlessServices(names=frozenset({("app", "*")})), True),
        (SelectorlessServices(names=frozenset({("app", "api"), ("other", "web")})), False),
    ],
)
def test_a_selectorless_services_endpoints_cross_as_written_only_when_named(
    named: SelectorlessServices, crosses_as_written: bool
) -> None:
    written = endpoint("10.99.0.1")  # the writer's choice: no pod behind it
    manager_label = upper_slice(written)  # labelled as the EndpointSlice controller's
    bare = upper_service(selector={})
    verdict = judge(manager_label, caches(service=bare, copy_=service_copy(of=bare)), named)
    assert verdict.crosses
    if crosses_as_written:
        assert verdict == Verdict(crosses=True, endpoints=(written,), selectorless=True)
    else:
        assert verdict == Verdict(
            crosses=True, dropped=(Dropped(("10.99.0.1",), SELECTORLESS),), selectorless=True
        )


# -- the message of the Event on the slice -----------------------------------------------------


def test_what_is_dropped_is_told_once_in_one_message() -> None:
    assert endpointslices.dropped_message(Verdict(crosses=False), node_name="vn-a") is None
    assert (
        endpointslices.dropped_message(Verdict(crosses=True, endpoints=(GOOD,)), node_name="vn-a")
        is None
    )
    two = Verdict(
        crosses=True,
        dropped=(
            Dropped(("10.99.0.2",), "not an IP of Pod web-1"),
            Dropped((), "its targetRef names no Pod"),
        ),
    )
    assert endpointslices.dropped_message(two, node_name="vn-a") == (
        "endpoints not copied to the lower cluster of virtual node vn-a: 10.99.0.2 (not an IP "
        "of Pod web-1); (no address) (its targetRef names no Pod). Only IPs of upper pods the "
        "Service selects cross (a selector-less Service's endpoints only when "
        "--selectorless-services names it)"
    )
    many = Verdict(crosses=True, dropped=tuple(Dropped((f"10.99.0.{n}",), "x") for n in range(8)))
    message = endpointslices.dropped_message(many, node_name="vn-a")
    assert message is not None
    assert "10.99.0.4 (x); and 3 more." in message
    assert "10.99.0.5" not in message


# -- the mirror's decisions -----------------------------------------------------------------


def slice_spec(
    view: Caches,
    *,
    managers: frozenset[str] = frozenset(),
    named: SelectorlessServices = NONE_NAMED,
) -> KindSpec:
    return endpointslices.slice_spec(
        tenancy=TENANCY,
        selection=services.ServiceSelection(slice_managers=managers),
        selectorless=named,
        caches=view,
    )


def sync(spec: KindSpec, upper: Obj, current: Obj | None) -> Any:
    return decide(
        "app/web-abcde",
        source=upper,
        current=current,
        spec=spec,
        siblings=SiblingPolicy.of(spec, tenancy=TENANCY),
        now=0.0,
    )


def test_a_slice_beside_our_service_copy_is_made_with_what_crosses() -> None:
    upper = upper_slice(GOOD, endpoint("10.96.0.1"))
    spec = slice_spec(caches(service=upper_service(), copy_=service_copy()))
    action = sync(spec, upper, None)
    assert isinstance(action, Create)
    assert [e["addresses"] for e in action.desired["endpoints"]] == [["10.244.1.5"]]
    assert ownership.is_owned(action.desired, owner=OWNER)
    assert isinstance(sync(spec, upper, action.desired), UpToDate)


@pytest.mark.parametrize(
    "view",
    [
        caches(service=upper_service()),  # the Service copy was refused
        caches(service=upper_service(uid="svc-2"), copy_=service_copy()),  # an earlier one's
        caches(copy_=service_copy()),  # the Service went
    ],
)
def test_copies_already_below_go_when_the_service_copy_no_longer_serves(view: Caches) -> None:
    upper = upper_slice()
    ours = services.lower_slice(upper, owner=OWNER, prefix="")
    assert isinstance(sync(slice_spec(view), upper, ours), Delete)
    # Nothing is made either.
    assert isinstance(sync(slice_spec(view), upper, None), Nothing)


def test_a_slice_whose_manager_is_not_named_is_not_considered_whatever_it_names() -> None:
    """--endpointslice-managers narrows: a copy of a slice it no longer names is deleted."""
    view = caches(service=upper_service(), copy_=service_copy())
    upper = upper_slice(GOOD, manager="someone.example")
    ours = services.lower_slice(upper, owner=OWNER, prefix="")
    narrowed = slice_spec(view, managers=frozenset({CONTROLLER}))
    assert isinstance(sync(narrowed, upper, ours), Delete)
    assert isinstance(sync(slice_spec(view), upper, ours), UpToDate)


def test_a_pod_that_changed_changes_the_copy() -> None:
    """The same slice decided over a pod cache that changed (its labels no longer
    selected): the endpoint goes below, though the slice upstairs is unchanged."""
    upper = upper_slice(GOOD)
    view = caches(service=upper_service(), copy_=service_copy())
    ours = services.lower_slice(upper, owner=OWNER, prefix="")
    relabelled = Caches(
        upper_services=view.upper_services,
        service_copies=view.service_copies,
        upper_pods={**PODS, "app/web-1": pod("web-1", labels={"app": "old"}, podIP="10.244.1.5")},
    )
    action = sync(slice_spec(relabelled), upper, ours)
    assert isinstance(action, Update)
    assert action.patch == Patch({"endpoints": []})


def test_a_sibling_nodes_slice_copy_is_kept_like_our_own_in_its_name() -> None:
    view = caches(service=upper_service(), copy_=service_copy(SIBLING))
    spec = slice_spec(view)
    shared = SiblingPolicy.of(spec, tenancy=TENANCY)
    their_slice = services.lower_slice(upper_slice(), owner=SIBLING, prefix="")
    assert shared.keeps("app/web-abcde", their_slice)
    assert not shared.keeps(
        "app/web-abcde", services.lower_slice(upper_slice(), owner=OTHER_CLUSTER, prefix="")
    )
    relabelled = upper_slice(endpoint("10.244.1.7", ref("db-1")))
    fewer = shared.in_makers_name(spec.translate(relabelled), their_slice)
    assert ownership.is_owned(fewer, owner=SIBLING)
    assert spec.compare(their_slice, fewer) == Patch({"endpoints": []})


# -- what brings a slice back: the indexes and the pod cache ------------------------------------


def test_a_slice_is_found_by_its_service_and_by_the_pods_it_names() -> None:
    upper = upper_slice(GOOD, endpoint("10.99.0.1"), endpoint("10.244.1.6", ref("web-2")))
    assert endpointslices.service_of_slice(upper) == ["app/web"]
    assert endpointslices.pods_of_slice(upper) == ["app/web-1", "app/web-2"]
    assert endpointslices.service_of_slice({"metadata": {"namespace": "app"}}) == []
    assert endpointslices.pods_of_slice({"metadata": {"namespace": "app"}, "endpoints": None}) == []


ALL_MIRRORED = services.ServiceSelection()


def _in(namespace: str, service: Obj) -> Obj:
    return {**service, "metadata": {**service["metadata"], "namespace": namespace}}


@pytest.mark.parametrize(
    ("service", "selection", "selects"),
    [
        (upper_service(), ALL_MIRRORED, True),
        (upper_service(selector={}), ALL_MIRRORED, False),  # selector-less: no pod is read
        ({**upper_service(), "spec": None}, ALL_MIRRORED, False),
        ({**upper_service(), "spec": {"selector": None}}, ALL_MIRRORED, False),
        (_in("kube-system", upper_service()), ALL_MIRRORED, False),  # never mirrored
        (upper_service(), services.ServiceSelection(namespaces=frozenset({"other"})), False),
        (upper_service(), services.ServiceSelection(namespaces=frozenset({"app"})), True),
    ],
)
def test_only_a_mirrored_service_with_a_selector_has_its_namespaces_pods_watched(
    service: Obj, selection: services.ServiceSelection, selects: bool
) -> None:
    """The upper pod cache covers the namespaces of such Services (the assembly's
    `_selecting_namespaces`), not every namespace; every other mirrored Service's slices
    are judged without reading a pod (selector-less)."""
    assert endpointslices.selects_pods(service, selection=selection) is selects
    if selection.covers("app", "web") and namespace_of(service) == "app":
        view = caches(service=service, copy_=service_copy(of=service))
        assert judge(upper_slice(GOOD), view).selectorless is not selects


def test_the_pod_cache_keeps_what_the_decision_reads() -> None:
    full = {
        "metadata": {
            "name": "web-1",
            "namespace": "app",
            "uid": "u",
            "resourceVersion": "7",
            "labels": {"app": "web"},
            "annotations": {"big": "x" * 1000},
            "managedFields": [{}],
        },
        "spec": {"containers": [{"name": "c", "image": "nginx"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}]},
    }
    slim = endpointslices.slim_upper_pod(full)
    assert slim == {
        "metadata": {
            "name": "web-1",
            "namespace": "app",
            "uid": "u",
            "resourceVersion": "7",
            "labels": {"app": "web"},
        },
        "status": {"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}]},
    }
    moved = copy.deepcopy(slim)
    moved["metadata"]["resourceVersion"] = "8"
    assert not endpointslices.pod_changed(slim, moved)  # only its conditions, say
    moved["status"] = {"podIPs": [{"ip": "10.0.0.2"}]}
    assert endpointslices.pod_changed(slim, moved)
    relabelled = copy.deepcopy(slim)
    relabelled["metadata"]["labels"] = {"app": "web", "canary": "true"}
    assert endpointslices.pod_changed(slim, relabelled)


# -- the engine: a dropped endpoint is told only once it outlasts the caches' lag ---------------


class _Writes:
    """An apiserver that records writes and shows them in `shown` (the target informer's
    store, as its watch would): the fake stands for both clusters, so the test can step a
    clock between two looks at one slice (what a real server cannot show on demand)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str]] = []
        self.shown: Informer | None = None

    async def request(
        self, method: str, path: str, *, body: Any = None, content_type: str | None = None
    ) -> Obj:
        self.writes.append((method, path))
        assert self.shown is not None
        if method == "POST":
            made = {**body, "metadata": {**body["metadata"], "uid": "made", "resourceVersion": "1"}}
            self.shown.store.upsert(made)
            return made
        current = self.shown.store.get("app/web-abcde")
        assert current is not None
        version = str(int(current["metadata"]["resourceVersion"]) + 1)
        patched = {
            **current,
            **body,
            "metadata": {**current["metadata"], "resourceVersion": version},
        }
        self.shown.store.upsert(patched)
        return patched


async def test_a_dropped_endpoint_is_told_once_and_only_when_it_outlasts_the_settle() -> None:
    now = [1000.0]
    told: list[str] = []
    pods: dict[str, Obj] = {}
    view = Caches(
        upper_services={"app/web": upper_service()},
        service_copies={"app/web": service_copy()},
        upper_pods=pods,
    )
    api = _Writes()
    upper = Informer(api, ENDPOINT_SLICES, name="test-upper")  # type: ignore[arg-type]
    lower = Informer(api, ENDPOINT_SLICES, name="test-lower")  # type: ignore[arg-type]
    api.shown = lower

    async def notice(_source: Obj, message: str) -> None:
        told.append(message)

    mirror = Mirror(
        spec=slice_spec(view),
        tenancy=TENANCY,
        source=upper,
        target=lower,
        source_client=api,  # type: ignore[arg-type]
        target_client=api,  # type: ignore[arg-type]
        on_notice=notice,
        clock=lambda: now[0],
    )
    upper.store.upsert(upper_slice(GOOD))
    # The slice came before the pod cache showed its pod: nothing is told yet, a look is due
    await mirror.sync("app/web-abcde")
    assert told == []
    assert mirror.queue.pending("app/web-abcde")
    # ... and the pod came a moment later (its event revisits the slice): nothing to tell.
    now[0] += 1.0
    pods.update(PODS)
    await mirror.sync("app/web-abcde")
    now[0] += endpointslices.NOTICE_SETTLE
    await mirror.sync("app/web-abcde")
    assert told == []
    assert [method for method, _path in api.writes] == ["POST", "PATCH"]

    # An endpoint that stays unverified is told once it has been so for the settle ...
    upper.store.upsert(upper_slice(GOOD, endpoint("10.99.0.1")))
    await mirror.sync("app/web-abcde")
    assert told == []
    now[0] += endpointslices.NOTICE_SETTLE
    await mirror.sync("app/web-abcde")
    assert len(told) == 1
    assert "10.99.0.1 (its targetRef names no Pod)" in told[0]
    # ... once.
    now[0] += endpointslices.NOTICE_SETTLE
    await mirror.sync("app/web-abcde")
    assert len(told) == 1
    await mirror.queue.shut_down()


# -- sibling virtual nodes under other --selectorless-services -----------------------------------


WEB_NAMED = SelectorlessServices(names=frozenset({("app", "web")}))


def test_a_selectorless_services_slice_copy_records_the_names_it_was_written_under() -> None:
    bare = upper_service(selector={})
    spec = slice_spec(caches(service=bare, copy_=service_copy(of=bare)), named=WEB_NAMED)
    made = spec.translate(upper_slice(endpoint("10.99.0.1")))
    assert annotations_of(made)[services.POLICY_ANNOTATION] == WEB_NAMED.policy
    # A slice of a Service that selects is the same under any names: it records none.
    selecting = slice_spec(caches(service=upper_service(), copy_=service_copy()), named=WEB_NAMED)
    assert services.POLICY_ANNOTATION not in annotations_of(selecting.translate(upper_slice(GOOD)))


@pytest.mark.parametrize(
    ("theirs", "ours", "left_to_its_maker"),
    [
        (WEB_NAMED, NONE_NAMED, True),  # they copy it whole, we would empty it
        (NONE_NAMED, WEB_NAMED, True),
        (WEB_NAMED, SelectorlessServices(names=frozenset({("app", "*")})), True),
        (WEB_NAMED, WEB_NAMED, False),
    ],
)
def test_a_siblings_selectorless_slice_copy_under_other_names_is_left_to_its_maker(
    theirs: SelectorlessServices, ours: SelectorlessServices, left_to_its_maker: bool
) -> None:
    bare = upper_service(selector={})
    view = caches(service=bare, copy_=service_copy(SIBLING, of=bare))
    upper = upper_slice(endpoint("10.99.0.1"))
    their_copy = services.lower_slice(
        upper, owner=SIBLING, prefix="", policy=theirs.policy, endpoints=None
    )
    spec = slice_spec(view, named=ours)
    assert spec.sibling_conflict is not None
    why = spec.sibling_conflict(their_copy, upper)
    assert (why is not None) == left_to_its_maker
    if why is not None:
        assert "--selectorless-services" in why


def test_a_siblings_slice_of_a_selecting_service_is_shared_whatever_the_names() -> None:
    view = caches(service=upper_service(), copy_=service_copy(SIBLING))
    upper = upper_slice(GOOD)
    their_copy = services.lower_slice(upper, owner=SIBLING, prefix="")
    spec = slice_spec(view, named=WEB_NAMED)
    assert spec.sibling_conflict is not None
    assert spec.sibling_conflict(their_copy, upper) is None


class _Services:
    """Stands for the upper Services' informer: records the handlers it is given."""

    def __init__(self) -> None:
        self.given: list[tuple[Any, bool]] = []

    def add_handlers(self, handlers: Any, *, always: bool = False) -> None:
        self.given.append((handlers, always))


def test_the_watched_namespaces_follow_the_services_that_select_and_a_standby_keeps_them() -> None:
    """Which namespaces' upper pods the node caches (vnode.providers.k2k.assembly): a
    namespace joins with its first mirrored Service that selects, stays while one is left,
    leaves with the last (deleted, or its selector removed); the handlers are told in a
    standby too (`always`), or a replica taking over would judge slices with no pods."""
    from vnode.providers.k2k import assembly  # noqa: PLC0415 - the assembly's own helper

    informer = _Services()
    watched = assembly._selecting_namespaces(informer, selection=ALL_MIRRORED)  # type: ignore[arg-type]
    [(handlers, always)] = informer.given
    assert always
    web, api = upper_service(), {**upper_service(), "metadata": {"name": "api", "namespace": "app"}}
    handlers.on_add(_in("kube-system", upper_service()))
    handlers.on_add(upper_service(selector={}))
    assert watched.names() == frozenset()
    handlers.on_add(web)
    handlers.on_add(api)
    assert watched.names() == {"app"}
    handlers.on_delete(web)
    assert watched.names() == {"app"}
    handlers.on_modify({**api, "spec": {"ports": []}})  # its selector removed
    assert watched.names() == frozenset()
    handlers.on_modify(api)
    assert watched.names() == {"app"}
    handlers.on_delete(api)
    assert watched.names() == frozenset()
