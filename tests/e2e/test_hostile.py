"""The hostile suite: a running virtual node between real clusters, attacked through its
kubelet API and through the lower cluster, must stay Ready, bounded and tight-lipped.

Each test prints the figures it measured (requests, renewals, peak RSS, descriptors) on a
line starting "hostile:" (pytest -s shows them).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import functools
import os
import secrets
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.fleet import Fleet
from devcluster.pki import CertificateAuthority, KeyPair
from devcluster.rest import RestClient
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts import ownership
from tests.e2e.helpers import create, kubelet_request, phase, pod_manifest, wait_for
from vnode.api import spdy

LEASE_RENEW_INTERVAL = 10.0  # the node's, seconds
LATE = 4.0  # seconds a renewal may come after its interval on 2 busy cores
FORWARD_PORT = 8080  # what the lower "pods" forward to (the harness's target server)


# -- measuring the node from outside --------------------------------------------------------


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _rss_mib(node: VirtualNodeProcess) -> float:
    assert node.process is not None
    return _status_kib(node.process.pid, "VmRSS") / 1024


def _peak_rss_mib(node: VirtualNodeProcess) -> float:
    assert node.process is not None
    return _status_kib(node.process.pid, "VmHWM") / 1024


def _fds(node: VirtualNodeProcess) -> int:
    assert node.process is not None
    return len(os.listdir(f"/proc/{node.process.pid}/fd"))


def _metric(node: VirtualNodeProcess, prefix: str) -> float:
    """Sum of the node's samples whose line starts with `prefix`."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in node.metrics().splitlines()
        if line.startswith(prefix)
    )


class HeartbeatWatch:
    """Samples the node's Lease and Ready condition every half second, in a thread."""

    def __init__(self, client: RestClient, node: str) -> None:
        self._client = client
        self._node = node
        self.renewals: list[dt.datetime] = []
        self.not_ready: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat-watch", daemon=True)

    def __enter__(self) -> HeartbeatWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                lease = self._client.request(
                    "GET",
                    f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self._node}",
                )
                node = self._client.request("GET", f"/api/v1/nodes/{self._node}")
            except Exception:
                continue
            renewed = dt.datetime.fromisoformat(lease["spec"]["renewTime"])
            if not self.renewals or renewed != self.renewals[-1]:
                self.renewals.append(renewed)
            ready = [c for c in node["status"].get("conditions") or [] if c["type"] == "Ready"]
            if not ready or ready[0]["status"] != "True":
                self.not_ready.append(str(ready[0]["status"] if ready else "missing"))

    def gaps(self) -> list[float]:
        """Seconds between consecutive renewals seen."""
        return [
            (b - a).total_seconds() for a, b in zip(self.renewals, self.renewals[1:], strict=False)
        ]


# -- talking to the kubelet API raw ---------------------------------------------------------


def _tls(fleet: Fleet, *, client: KeyPair | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(fleet.vnode.client_ca))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    return context


def _connect(
    fleet: Fleet, node: VirtualNodeProcess, context: ssl.SSLContext, *, rcvbuf: int = 0
) -> ssl.SSLSocket:
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    raw.settimeout(30)
    raw.connect((fleet.node_ip, node.kubelet_port))
    return context.wrap_socket(raw, server_hostname=fleet.node_ip)


def _head(sock: ssl.SSLSocket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)  # byte by byte: what follows the head is SPDY
        if not chunk:
            break
        head += chunk
    return head


def _spdy_port_forward(
    fleet: Fleet, node: VirtualNodeProcess, namespace: str, pod: str, *, rcvbuf: int = 0
) -> ssl.SSLSocket:
    """An upgraded SPDY/3.1 port-forward connection, as the upper apiserver would open."""
    sock = _connect(fleet, node, _tls(fleet, client=fleet.upper.kubelet_client), rcvbuf=rcvbuf)
    sock.sendall(
        f"POST /portForward/{namespace}/{pod} HTTP/1.1\r\nHost: node\r\n"
        "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
        "X-Stream-Protocol-Version: portforward.k8s.io\r\n\r\n".encode()
    )
    head = _head(sock)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


# -- heartbeats under a flood of random tokens -------------------------------------------------


def _hit_and_run(fleet: Fleet, node: VirtualNodeProcess, context: ssl.SSLContext) -> bool:
    """One request with a random bearer token, closed as soon as it is sent."""
    try:
        with _connect(fleet, node, context) as sock:
            sock.sendall(
                f"GET /pods HTTP/1.1\r\nHost: node\r\n"
                f"Authorization: Bearer {secrets.token_urlsafe(24)}\r\n\r\n".encode()
            )
    except OSError:
        return False
    return True


def test_a_flood_of_random_tokens_leaves_the_node_ready_with_every_renewal_on_time(
    fleet: Fleet, virtual_node: VirtualNodeProcess
) -> None:
    requests = 5000
    context = _tls(fleet)
    rss_before = _rss_mib(virtual_node)
    with HeartbeatWatch(fleet.upper.rest(), virtual_node.name) as watch:
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
            sent = sum(
                pool.map(lambda _: _hit_and_run(fleet, virtual_node, context), range(requests))
            )
        flood_seconds = time.monotonic() - started
        time.sleep(LEASE_RENEW_INTERVAL + LATE)  # the renewal after the flood too
        # Every slot taken by an abandoned request came back: a caller now is served at once.
        begun = time.monotonic()
        status, _ = kubelet_request(fleet, virtual_node.kubelet_port, "/pods", cert=True)
        answered_in = time.monotonic() - begun
    reviews = _metric(virtual_node, 'tensile_api_requests_total{cluster="upper-reviews"')
    gaps = watch.gaps()
    print(
        f"hostile: {sent}/{requests} requests in {flood_seconds:.1f}s "
        f"({sent / flood_seconds:.0f}/s); TokenReviews sent {reviews:.0f}; "
        f"renewals seen {len(watch.renewals)}, longest gap {max(gaps, default=0):.1f}s "
        f"(interval {LEASE_RENEW_INTERVAL:.0f}s); RSS {rss_before:.0f} -> peak "
        f"{_peak_rss_mib(virtual_node):.0f} MiB; a real caller answered in {answered_in:.2f}s"
    )
    assert sent >= requests * 0.99
    assert status == 200
    assert answered_in < 2.0
    assert not watch.not_ready, f"the node was not Ready: {watch.not_ready}"
    expected = (time.monotonic() - started) / LEASE_RENEW_INTERVAL
    assert len(watch.renewals) >= expected - 2, watch.renewals
    assert max(gaps) <= LEASE_RENEW_INTERVAL + LATE, gaps
    virtual_node.check()


# -- heartbeats while the node's lower budget is used up ----------------------------------------


def test_renewals_stay_on_time_while_log_readers_use_up_the_lower_client_budget(
    fleet: Fleet, nodes: list[VirtualNodeProcess], namespace: str, tmp_path: Path
) -> None:
    """Every log request through the kubelet API takes a slot of the lower client's rate
    budget (--client-qps); the Lease is renewed only after the lower cluster answered a
    ping. Callers reading logs as fast as the node serves them keep that budget queued, so
    a ping that waits its turn among them comes late and the renewal with it. The budget is
    scaled down (5/s) so that 2 cores can keep it busy; at the default 500/s a busier
    cluster does the same."""
    qps = 5
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        args=(f"--client-qps={qps}", f"--client-burst={qps}"),
    )
    nodes.append(node)
    node.start()
    upper = fleet.upper.rest()
    create(upper, namespace, pod_manifest("web", node=node.name))
    wait_for("web Running", lambda: phase(upper, namespace, "web") == "Running", timeout=60)
    readers, seconds = 64, 2 * LEASE_RENEW_INTERVAL + LATE
    path = f"/containerLogs/{namespace}/web/main?tailLines=1"
    stop = time.monotonic() + seconds

    def read_logs(_: int) -> int:
        served = 0
        while time.monotonic() < stop:
            with contextlib.suppress(OSError):
                status, _body = kubelet_request(fleet, node.kubelet_port, path, cert=True)
                served += status == 200
        return served

    with HeartbeatWatch(upper, node.name) as watch:
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=readers) as pool:
            served = sum(pool.map(read_logs, range(readers)))
        elapsed = time.monotonic() - started
    gaps = watch.gaps()
    print(
        f"hostile: {readers} log readers for {elapsed:.0f}s on a lower budget of {qps}/s: "
        f"{served} logs served; renewals seen {len(watch.renewals)}, longest gap "
        f"{max(gaps, default=0):.1f}s (interval {LEASE_RENEW_INTERVAL:.0f}s); peak RSS "
        f"{_peak_rss_mib(node):.0f} MiB"
    )
    assert served >= qps * seconds / 2, "the readers did not keep the budget busy"
    assert not watch.not_ready, f"the node was not Ready: {watch.not_ready}"
    assert len(watch.renewals) >= elapsed / LEASE_RENEW_INTERVAL - 1, watch.renewals
    assert max(gaps) <= LEASE_RENEW_INTERVAL + LATE, gaps
    node.check()


# -- a lower cluster flooding Events ---------------------------------------------------------


def test_a_flood_of_lower_events_delays_neither_statuses_nor_heartbeats(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str, running_pod: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    owner = virtual_node.owner
    owned = lower.request(
        "GET", "/api/v1/pods", query={"labelSelector": ownership.owner_selector(owner)}
    )["items"]
    lower_pod = next(
        p
        for p in owned
        if p["metadata"]["annotations"].get(ownership.UPPER_NAMESPACE_ANNOTATION) == namespace
    )
    lower_ns, lower_name = lower_pod["metadata"]["namespace"], lower_pod["metadata"]["name"]
    events = 2000

    def event(i: int) -> bool:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body: dict[str, Any] = {
            "metadata": {"name": f"flood-{i}-{secrets.token_hex(3)}", "namespace": lower_ns},
            "involvedObject": {
                "kind": "Pod", "namespace": lower_ns, "name": lower_name,
                "uid": lower_pod["metadata"]["uid"], "apiVersion": "v1",
            },
            "reason": "Flood", "message": f"event {i}", "type": "Warning",
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "source": {"component": "flooder"},
        }  # fmt: skip
        try:
            lower.request("POST", f"/api/v1/namespaces/{lower_ns}/events", body=body)
        except Exception:
            return False
        return True

    latencies: list[float] = []
    with HeartbeatWatch(upper, virtual_node.name) as watch:
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            flood = pool.map(event, range(events))
            # While the flood runs, new pods must go Running upstairs as fast as ever.
            for i in range(3):
                name = f"during-{i}"
                begun = time.monotonic()
                create(upper, namespace, pod_manifest(name, node=virtual_node.name))
                wait_for("Running", functools.partial(_running, upper, namespace, name))
                latencies.append(time.monotonic() - begun)
            posted = sum(flood)
        flood_seconds = time.monotonic() - started
        time.sleep(LEASE_RENEW_INTERVAL + LATE)
    mirrored = _metric(virtual_node, 'tensile_api_requests_total{cluster="upper-events"')
    gaps = watch.gaps()
    print(
        f"hostile: {posted}/{events} lower Events in {flood_seconds:.1f}s; upper Event "
        f"writes {mirrored:.0f}; pods Running in {', '.join(f'{s:.1f}s' for s in latencies)}; "
        f"longest renewal gap {max(gaps, default=0):.1f}s"
    )
    assert posted >= events * 0.99
    assert max(latencies) < 10.0, latencies
    assert not watch.not_ready
    assert max(gaps) <= LEASE_RENEW_INTERVAL + LATE, gaps


def _running(client: RestClient, namespace: str, name: str) -> bool:
    return phase(client, namespace, name) == "Running"


# -- SPDY: a peer that sends and never reads ---------------------------------------------------


def test_a_client_that_sends_pings_and_never_reads_cannot_grow_the_node(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str, running_pod: str
) -> None:
    writer = spdy.FrameWriter()
    batch = b"".join(writer.encode(spdy.Ping(ping_id=2 * i + 1)) for i in range(8192))
    rss_before = _rss_mib(virtual_node)
    sent = 0
    with _spdy_port_forward(fleet, virtual_node, namespace, running_pod, rcvbuf=4096) as sock:
        sock.settimeout(1.0)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and sent < 512 * 1024 * 1024:
            try:
                sent += sock.send(batch)
            except TimeoutError:
                continue  # the node stopped reading: keep trying until the deadline
        grown = _rss_mib(virtual_node) - rss_before
        print(
            f"hostile: {sent / 2**20:.1f} MiB of PINGs ({sent // 12} frames) sent in 15s "
            f"without reading; node RSS +{grown:.1f} MiB"
        )
    assert grown < 48, f"the node grew {grown:.0f} MiB"
    status, body = kubelet_request(fleet, virtual_node.kubelet_port, "/healthz", cert=True)
    assert (status, body) == (200, "ok")


def test_ten_thousand_port_forward_request_ids_leave_descriptors_bounded(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str, running_pod: str
) -> None:
    pairs = 10_000
    fds_before = _fds(virtual_node)
    peak = [fds_before]
    counts = {"SynReply": 0, "RstStream": 0, "Data": 0}
    writer = spdy.FrameWriter()
    frames = bytearray()
    stream_id = 1
    for i in range(pairs):
        for kind in ("error", "data"):
            headers = {"streamtype": [kind], "port": [str(FORWARD_PORT)], "requestid": [str(i)]}
            frames += writer.encode(spdy.SynStream(stream_id=stream_id, headers=headers))
            stream_id += 2
    reader = spdy.FrameReader()
    # One thread drives the TLS socket both ways (an SSL connection is not safe to read and
    # write from two threads at once): send while the node reads, read what it answers.
    sock = _spdy_port_forward(fleet, virtual_node, namespace, running_pod)
    try:
        sock.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 90
        settled: float | None = None
        next_fd_check = 0.0
        while time.monotonic() < deadline:
            now = time.monotonic()
            if now >= next_fd_check:
                peak.append(_fds(virtual_node))
                next_fd_check = now + 0.2
            if sent == len(frames) and counts["RstStream"] > 0:
                settled = settled or now + 2  # a little longer, for the peak
                if now >= settled:
                    break
            want_write = [sock] if sent < len(frames) else []
            readable, writable, _ = select.select([sock], want_write, [], 0.2)
            if writable or (want_write and sock.pending()):
                with contextlib.suppress(ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    sent += sock.send(frames[sent : sent + 65536])
            if readable or sock.pending():
                try:
                    chunk = sock.recv(65536)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    continue
                if not chunk:
                    break
                for frame in reader.feed(chunk):
                    kind = type(frame).__name__
                    if kind in counts:
                        counts[kind] += 1
        during = max(peak)
    finally:
        sock.close()
    assert sent == len(frames), f"the node stopped reading after {sent} of {len(frames)} bytes"
    after = wait_for(
        "descriptors back", lambda: (n := _fds(virtual_node)) <= fds_before + 16 and n, timeout=60
    )
    print(
        f"hostile: {pairs} port-forward pairs on one session: {counts['SynReply']} streams "
        f"accepted, {counts['RstStream']} reset; node descriptors {fds_before} -> peak "
        f"{during} -> {after} after; peak RSS {_peak_rss_mib(virtual_node):.0f} MiB"
    )
    assert during <= fds_before + 300, f"descriptors grew to {during}"
    assert counts["RstStream"] > 0, "nothing was refused"
    status, body = kubelet_request(fleet, virtual_node.kubelet_port, "/healthz", cert=True)
    assert (status, body) == (200, "ok")


# -- who may call ----------------------------------------------------------------------------


@pytest.fixture
def stats_only_token(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> Iterator[str]:
    """A token of a ServiceAccount allowed `get nodes/stats` on the node, nothing else."""
    role = f"stats-only-{virtual_node.name}"
    kubectl = fleet.upper.kubectl
    kubectl("create", "serviceaccount", "stats-only", "-n", namespace)
    kubectl(
        "create", "clusterrole", role, "--verb=get,create", "--resource=nodes/stats",
        f"--resource-name={virtual_node.name}",
    )  # fmt: skip
    kubectl(
        "create", "clusterrolebinding", role, f"--clusterrole={role}",
        f"--serviceaccount={namespace}:stats-only",
    )  # fmt: skip
    try:
        yield kubectl("create", "token", "stats-only", "-n", namespace).stdout.strip()
    finally:
        kubectl("delete", "clusterrolebinding,clusterrole", role, check=False)


def test_a_caller_allowed_only_stats_reaches_nothing_else_however_the_path_is_spelled(
    fleet: Fleet,
    virtual_node: VirtualNodeProcess,
    namespace: str,
    running_pod: str,
    stats_only_token: str,
) -> None:
    port = virtual_node.kubelet_port
    exec_tail = f"exec/{namespace}/{running_pod}/main?command=id&output=1"
    run_tail = f"run/{namespace}/{running_pod}/main?cmd=id"
    logs_tail = f"containerLogs/{namespace}/{running_pod}/main"
    status, _ = kubelet_request(fleet, port, "/stats/summary", token=stats_only_token)
    assert status == 200  # the caller is who the test thinks
    tricks = [
        ("GET", f"/stats/../{exec_tail}"),
        ("GET", f"/stats/%2E%2E/{exec_tail}"),
        ("GET", f"/stats%2F..%2F{exec_tail}"),
        ("GET", f"/stats/summary/../../{logs_tail}"),
        ("GET", f"/stats/./../{logs_tail}"),
        ("GET", f"//{logs_tail}"),
        ("GET", f"/{logs_tail.replace('/', '%2F')}"),
        ("GET", "/stats/../pods"),
        ("POST", f"/stats/../{run_tail}"),
        ("POST", f"/stats%2F..%2F{run_tail}"),
        ("POST", f"/stats/summary/..%2F..%2F{run_tail}"),
        ("POST", f"/{run_tail}"),
        ("GET", f"/{logs_tail}"),
    ]
    answers = {
        f"{method} {path}": kubelet_request(
            fleet, port, path, method=method, token=stats_only_token
        )
        for method, path in tricks
    }
    let_through = {k: v for k, v in answers.items() if v[0] not in (403, 404)}
    print(f"hostile: {len(tricks)} path tricks: {sorted({v[0] for v in answers.values()})}")
    assert not let_through, let_through


def _refused(fleet: Fleet, node: VirtualNodeProcess, client: KeyPair) -> str:
    """Call /pods with `client`'s certificate; return how it was refused, or fail."""
    try:
        with _connect(fleet, node, _tls(fleet, client=client)) as sock:
            sock.sendall(b"GET /pods HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
            head = _head(sock)
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as exc:
        return f"handshake: {type(exc).__name__}"
    if not head:
        return "handshake: closed"  # TLS 1.3: the alert arrives on the first read
    status = head.split(b" ", 2)[1]
    assert status == b"401", head
    return "401"


def test_client_certificates_a_kubelet_refuses_are_refused(
    fleet: Fleet, virtual_node: VirtualNodeProcess, tmp_path: Path
) -> None:
    upper_ca = CertificateAuthority(
        pair=KeyPair(cert=fleet.upper.ca, key=fleet.upper.ca.with_suffix(".key"))
    )
    stranger = CertificateAuthority.create(directory=tmp_path, name="stranger-ca")
    who: dict[str, Any] = {
        "common_name": "kube-apiserver-kubelet-client",
        "organizations": ("system:masters",),
    }
    now = dt.datetime.now(dt.UTC)
    good = upper_ca.issue(directory=tmp_path, name="good", client=True, **who)
    bad = {
        "wrong CA": stranger.issue(directory=tmp_path, name="wrong-ca", client=True, **who),
        "expired": upper_ca.issue(
            directory=tmp_path, name="expired", client=True,
            not_before=now - dt.timedelta(days=2), not_after=now - dt.timedelta(days=1), **who,
        ),
        "not yet valid": upper_ca.issue(
            directory=tmp_path, name="future", client=True,
            not_before=now + dt.timedelta(days=1), not_after=now + dt.timedelta(days=2), **who,
        ),
        "server-only key usage": upper_ca.issue(
            directory=tmp_path, name="server-only", server=True, client=False, **who
        ),
    }  # fmt: skip
    with _connect(fleet, virtual_node, _tls(fleet, client=good)) as sock:
        sock.sendall(b"GET /pods HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
        assert _head(sock).startswith(b"HTTP/1.1 200"), "the same identity, properly issued"
    refusals = {reason: _refused(fleet, virtual_node, pair) for reason, pair in bad.items()}
    print(f"hostile: client certificates: {refusals}")
    status, _ = kubelet_request(fleet, virtual_node.kubelet_port, "/healthz", cert=True)
    assert status == 200
