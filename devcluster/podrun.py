"""Run the container of a pod that kwok "runs" on an upper cluster's host Node as a real
local process, the way a kubelet would start it.

kwok only marks pods Running; for a workload that must really run (a virtual node deployed
from `manifests/vnode/virtual-node.yaml`), this stands in for the container runtime: the
pod's own command, arguments and environment (literal values, the downward API, ConfigMap
and Secret keys, `$(VAR)` references), its volumes (ConfigMaps, Secrets, emptyDirs, and
the projected ServiceAccount token, requested for the pod as a kubelet does) written below
a root directory of its own, and its identity. The process shares the host's network: the
pods this is for use hostNetwork, so their address is the host Node's.

Two differences from a container, both because a local process has no filesystem of its
own: mount paths are rewritten under the root directory wherever the command line or an
environment variable names them, and the in-cluster credentials (the token, CA and
apiserver address a pod finds at /var/run/secrets/kubernetes.io/serviceaccount and in
KUBERNETES_SERVICE_HOST) are handed over as a kubeconfig in $KUBECONFIG instead.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devcluster import processes, programs
from devcluster.cluster import Cluster
from devcluster.kubeconfig import write_kubeconfig
from devcluster.rest import ApiStatusError, RestClient
from tensile.contracts.objects import meta_of

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_TOKEN_SECONDS = 24 * 3600
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class PodRunError(RuntimeError):
    """The pod cannot be run locally (unsupported field, missing object); says why."""


@dataclass(frozen=True, kw_only=True)
class LocalContainer:
    """What to start for a pod's container (pure description, see `describe`)."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    files: Mapping[str, bytes]
    """Relative path below the root directory -> content."""
    directories: tuple[str, ...]
    """Relative paths below the root directory to create (emptyDirs)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Expand `$(VAR)` references as the kubelet does for command, args and env values:
    defined variables are replaced, undefined ones kept as written, `$$` is a `$`
    (Kubernetes "Define dependent environment variables")."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR.sub(one, text)


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """Return a downward-API field of `pod` (the fieldRef paths an env var may name).
    Raises PodRunError for others."""
    meta, spec, status = meta_of(pod), pod.get("spec") or {}, pod.get("status") or {}
    values = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if path not in values:
        raise PodRunError(f"fieldRef {path} is not supported here")
    return str(values[path] or "")


def rewrite_paths(text: str, *, mounts: Sequence[str], root: Path) -> str:
    """Put `root` in front of every mount path `text` names at its start or after `=`.

    One pass, the longest mount first at each place: a path already under `root` is never
    rewritten again (a mount at /tmp while `root` is itself below /tmp)."""
    ordered = sorted({m.rstrip("/") for m in mounts if m.rstrip("/")}, key=len, reverse=True)
    if not ordered:
        return text
    pattern = re.compile(rf"(^|=)({'|'.join(re.escape(m) for m in ordered)})(?=/|$)")
    return pattern.sub(lambda match: f"{match.group(1)}{root}{match.group(2)}", text)


def describe(
    pod: Mapping[str, Any],
    *,
    objects: Mapping[tuple[str, str], Mapping[str, str]],
    token: str,
    ca: bytes,
    root: Path,
) -> LocalContainer:
    """Return how to run the first container of `pod` below `root` (pure).

    `objects` holds the decoded data of the ConfigMaps and Secrets the pod names, by
    (kind, name); `token` is the pod's ServiceAccount token and `ca` the cluster's CA.
    Raises PodRunError for what cannot be run locally.
    """
    spec = pod.get("spec") or {}
    container = (spec.get("containers") or [{}])[0]
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        name = var["name"]
        source = var.get("valueFrom")
        if source is None:
            env[name] = expand(str(var.get("value", "")), env)
        elif "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "configMapKeyRef" in source or "secretKeyRef" in source:
            kind = "ConfigMap" if "configMapKeyRef" in source else "Secret"
            ref = source.get("configMapKeyRef") or source["secretKeyRef"]
            data = objects.get((kind, ref["name"]), {})
            if ref["key"] not in data:
                raise PodRunError(f"{kind} {ref['name']} has no key {ref['key']}")
            env[name] = data[ref["key"]]
        else:
            raise PodRunError(f"env {name}: valueFrom {sorted(source)} is not supported here")
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    files: dict[str, bytes] = {}
    directories: list[str] = []
    mounts: list[str] = []
    for mount in container.get("volumeMounts") or []:
        path = str(mount["mountPath"]).rstrip("/")
        mounts.append(path)
        volume = volumes.get(mount["name"])
        if volume is None:
            raise PodRunError(f"volumeMount {mount['name']} names no volume")
        relative = path.lstrip("/")
        if "emptyDir" in volume:
            directories.append(relative)
            continue
        for name, content in _volume_files(volume, objects=objects, token=token, ca=ca).items():
            files[f"{relative}/{name}"] = content
    command = [*(container.get("command") or []), *(container.get("args") or [])]
    if not command:
        raise PodRunError("the container names no command (an image's entrypoint is unknown)")
    argv = tuple(rewrite_paths(expand(a, env), mounts=mounts, root=root) for a in command)
    env = {k: rewrite_paths(v, mounts=mounts, root=root) for k, v in env.items()}
    # After the rewrite: this path is below `root` already.
    if token and SERVICE_ACCOUNT_DIR in mounts:
        env.setdefault("KUBECONFIG", str(root / SERVICE_ACCOUNT_DIR.lstrip("/") / "kubeconfig"))
    return LocalContainer(argv=argv, env=env, files=files, directories=tuple(directories))


def _volume_files(
    volume: Mapping[str, Any],
    *,
    objects: Mapping[tuple[str, str], Mapping[str, str]],
    token: str,
    ca: bytes,
) -> dict[str, bytes]:
    if "configMap" in volume or "secret" in volume:
        kind = "ConfigMap" if "configMap" in volume else "Secret"
        source = volume.get("configMap") or volume["secret"]
        name = source.get("name") or source.get("secretName")
        data = objects.get((kind, name))
        if data is None:
            raise PodRunError(f"{kind} {name} of volume {volume['name']} does not exist")
        return _items(data, source.get("items"))
    if "projected" in volume:
        out: dict[str, bytes] = {}
        for source in volume["projected"].get("sources") or []:
            if "serviceAccountToken" in source:
                out[source["serviceAccountToken"]["path"]] = token.encode()
            elif "configMap" in source and source["configMap"]["name"] == "kube-root-ca.crt":
                out.update(_items({"ca.crt": ca.decode()}, source["configMap"].get("items")))
            elif "downwardAPI" in source:
                continue  # the namespace file: nothing here reads it
            else:
                raise PodRunError(f"projected source {sorted(source)} is not supported here")
        return out
    raise PodRunError(f"volume {volume['name']}: only configMap, secret, emptyDir and projected")


def _items(data: Mapping[str, str], items: list[dict[str, str]] | None) -> dict[str, bytes]:
    if not items:
        return {key: value.encode() for key, value in data.items()}
    return {item["path"]: data[item["key"]].encode() for item in items}


class LocalPod(programs.ChildProcess):
    """A pod of the upper cluster whose container runs here; `start()` it, `stop()` it."""

    def __init__(self, cluster: Cluster, *, namespace: str, name: str, directory: Path) -> None:
        super().__init__()
        self.cluster = cluster
        self.namespace = namespace
        self.name = name
        self.root = directory / "root"
        self.log = directory / f"{name}.log"

    def wait_running(self, *, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until kwok reports the pod Running with an IP; return it. Raises TimeoutError."""
        client = self.cluster.rest()
        deadline = time.monotonic() + timeout
        while True:
            try:
                pod = client.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{self.name}")
            except ApiStatusError as exc:
                if exc.code != 404:
                    raise
                pod = {}
            status = pod.get("status") or {}
            if status.get("phase") == "Running" and status.get("podIP"):
                return pod
            if time.monotonic() > deadline:
                raise TimeoutError(f"pod {self.namespace}/{self.name} not Running in {timeout}s")
            time.sleep(0.2)

    def start(self, *, timeout: float = 60.0) -> LocalPod:
        """Wait for the pod to run upstairs, then start its container here."""
        pod = self.wait_running(timeout=timeout)
        client = self.cluster.rest()
        container = describe(
            pod,
            objects=self._objects(client, pod),
            token=self._token(client, pod),
            ca=self.cluster.ca.read_bytes(),
            root=self.root,
        )
        shutil.rmtree(self.root, ignore_errors=True)
        for relative in container.directories:
            (self.root / relative).mkdir(parents=True, exist_ok=True)
        for relative, content in container.files.items():
            path = self.root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(content)
        token_dir = self.root / SERVICE_ACCOUNT_DIR.lstrip("/")
        if (token_dir / "token").exists():
            write_kubeconfig(
                path=token_dir / "kubeconfig",
                cluster=self.cluster.name,
                server=self.cluster.server,
                ca=token_dir / "ca.crt",
                user="pod",
                token_file=token_dir / "token",
            )
        executable = shutil.which(
            container.argv[0],
            path=os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))),
        )
        if executable is None:
            raise PodRunError(f"{container.argv[0]!r} is not installed here")
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.root), **container.env}
        self.process = processes.Process(
            name=f"pod-{self.name}",
            argv=[executable, *container.argv[1:]],
            log=self.log,
            env=env,
            cwd=self.root,
        )
        return self

    def _objects(
        self, client: RestClient, pod: Mapping[str, Any]
    ) -> dict[tuple[str, str], dict[str, str]]:
        wanted: set[tuple[str, str]] = set()
        spec = pod.get("spec") or {}
        for volume in spec.get("volumes") or []:
            if "configMap" in volume:
                wanted.add(("ConfigMap", volume["configMap"]["name"]))
            if "secret" in volume:
                wanted.add(("Secret", volume["secret"]["secretName"]))
        for container in spec.get("containers") or []:
            for var in container.get("env") or []:
                source = var.get("valueFrom") or {}
                if "configMapKeyRef" in source:
                    wanted.add(("ConfigMap", source["configMapKeyRef"]["name"]))
                if "secretKeyRef" in source:
                    wanted.add(("Secret", source["secretKeyRef"]["name"]))
        out: dict[tuple[str, str], dict[str, str]] = {}
        for kind, name in wanted:
            plural = "configmaps" if kind == "ConfigMap" else "secrets"
            try:
                obj = client.request("GET", f"/api/v1/namespaces/{self.namespace}/{plural}/{name}")
            except ApiStatusError as exc:
                if exc.code == 404:
                    continue
                raise
            data = obj.get("data") or {}
            if kind == "Secret":
                data = {k: base64.b64decode(v).decode() for k, v in data.items()}
            out[(kind, name)] = data
        return out

    def _token(self, client: RestClient, pod: Mapping[str, Any]) -> str:
        """Request the pod's ServiceAccount token, bound to the pod (as a kubelet does)."""
        spec = pod.get("spec") or {}
        if spec.get("automountServiceAccountToken") is False:
            return ""
        account = spec.get("serviceAccountName") or "default"
        meta = meta_of(pod)
        answer = client.request(
            "POST",
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "expirationSeconds": _TOKEN_SECONDS,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": meta["name"],
                        "uid": meta["uid"],
                    },
                },
            },
        )
        return str(answer["status"]["token"])
