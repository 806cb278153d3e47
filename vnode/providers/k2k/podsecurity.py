"""The Pod Security Standards, checked by the virtual node before a pod goes below (pure).

A lower cluster enforces the standards only in namespaces labelled for it; a virtual node
also places pods in namespaces it did not create (shared, unprefixed ones), so it checks
every pod itself against `--pod-security-level` and refuses one above the level with the
reasons, in the spirit of the PodSecurity admission's messages. The controls and their
allowed values are those of kubernetes.io/docs/concepts/security/pod-security-standards
(policy version "latest" as of Kubernetes 1.37): `baseline` forbids the known privilege
escalations, `restricted` adds the hardening rules. `privileged` allows everything.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tensile.contracts.objects import annotations_of, as_list, as_mapping, dicts_in
from vnode.settings import PodSecurityLevel

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
"""Namespace label the lower PodSecurity admission enforces; set on namespaces tensile creates."""

_CONTAINER_GROUPS = ("initContainers", "containers", "ephemeralContainers")
_BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
        "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip
_SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
_SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
    }
)  # fmt: skip
_RESTRICTED_VOLUMES = frozenset(
    {
        "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
        "projected", "secret",
    }
)  # fmt: skip
_APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
_SECCOMP_OK = ("RuntimeDefault", "Localhost")


def violations(pod: Mapping[str, Any], *, level: PodSecurityLevel) -> list[str]:
    """Return why `pod` does not meet `level`, one reason per control (empty: it does).

    Each reason names the control and where it is broken, e.g.
    `hostPath volumes (volume "data")` or `privileged (container "app")`.
    """
    if level == "privileged":
        return []
    found = list(_baseline(pod))
    if level == "restricted":
        found += list(_restricted(pod))
    return found


def _baseline(pod: Mapping[str, Any]) -> Iterator[str]:
    spec = as_mapping(pod.get("spec"))
    pod_context = as_mapping(spec.get("securityContext"))
    containers = _containers(spec)
    yield from _host_access(spec, pod_context, containers)
    if names := [_name(c) for c in containers if _context(c).get("privileged") is True]:
        yield f"privileged ({_containers_named(names)})"
    added: set[str] = set()
    for container in containers:
        capabilities = as_mapping(_context(container).get("capabilities"))
        added |= {str(cap) for cap in as_list(capabilities.get("add"))}
    if extra := sorted(added - _BASELINE_CAPABILITIES):
        yield f"non-default capabilities ({', '.join(extra)})"
    yield from _apparmor(pod, pod_context, containers)
    contexts = [pod_context, *(_context(c) for c in containers)]
    for options in (as_mapping(c.get("seLinuxOptions")) for c in contexts):
        if (
            str(options.get("type") or "") not in _SELINUX_TYPES
            or options.get("user")
            or options.get("role")
        ):
            yield "seLinuxOptions (a type other than the container types, or a user or role)"
            break
    if names := [
        _name(c) for c in containers if _context(c).get("procMount") not in (None, "Default")
    ]:
        yield f"procMount ({_containers_named(names)})"
    if any(as_mapping(c.get("seccompProfile")).get("type") == "Unconfined" for c in contexts):
        yield "seccompProfile (type Unconfined)"
    unsafe = [
        str(s.get("name"))
        for s in dicts_in(pod_context.get("sysctls"))
        if str(s.get("name")) not in _SAFE_SYSCTLS
    ]
    if unsafe:
        yield f"forbidden sysctls ({', '.join(unsafe)})"


def _host_access(
    spec: Mapping[str, Any], pod_context: Mapping[str, Any], containers: list[dict[str, Any]]
) -> Iterator[str]:
    if as_mapping(pod_context.get("windowsOptions")).get("hostProcess") is True or any(
        as_mapping(_context(c).get("windowsOptions")).get("hostProcess") is True for c in containers
    ):
        yield "hostProcess (Windows host-process containers)"
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field) is True:
            yield f"host namespaces ({field}=true)"
    if names := [str(v.get("name")) for v in dicts_in(spec.get("volumes")) if "hostPath" in v]:
        yield f"hostPath volumes ({_quoted('volume', names)})"
    ports = [
        str(port.get("hostPort"))
        for container in containers
        for port in dicts_in(container.get("ports"))
        if port.get("hostPort") not in (None, 0)
    ]
    if ports:
        yield f"hostPort ({', '.join(ports)})"


def _apparmor(
    pod: Mapping[str, Any], pod_context: Mapping[str, Any], containers: list[dict[str, Any]]
) -> Iterator[str]:
    annotations = annotations_of(pod)
    bad = [
        f"{key.removeprefix(_APPARMOR_ANNOTATION)}={value}"
        for key, value in annotations.items()
        if key.startswith(_APPARMOR_ANNOTATION)
        and value != "runtime/default"
        and not str(value).startswith("localhost/")
    ]
    profiles = [pod_context, *(_context(c) for c in containers)]
    if bad or any(
        as_mapping(c.get("appArmorProfile")).get("type") == "Unconfined" for c in profiles
    ):
        yield "AppArmor profile (Unconfined, or not runtime/default or localhost/*)"


def _restricted(pod: Mapping[str, Any]) -> Iterator[str]:
    spec = as_mapping(pod.get("spec"))
    pod_context = as_mapping(spec.get("securityContext"))
    containers = _containers(spec)
    kinds = sorted(
        {
            kind
            for volume in dicts_in(spec.get("volumes"))
            for kind in volume
            if kind != "name" and kind not in _RESTRICTED_VOLUMES and kind != "hostPath"
        }
    )
    if kinds:
        yield f"restricted volume types ({', '.join(kinds)})"
    if names := [
        _name(c) for c in containers if _context(c).get("allowPrivilegeEscalation") is not False
    ]:
        yield f"allowPrivilegeEscalation != false ({_containers_named(names)})"
    pod_non_root = pod_context.get("runAsNonRoot")
    root_allowed = [
        _name(c)
        for c in containers
        if _context(c).get("runAsNonRoot") is False
        or (_context(c).get("runAsNonRoot") is None and pod_non_root is not True)
    ]
    if root_allowed:
        yield f"runAsNonRoot != true ({_containers_named(root_allowed)})"
    if pod_context.get("runAsUser") == 0 or any(
        _context(c).get("runAsUser") == 0 for c in containers
    ):
        yield "runAsUser=0"
    if as_mapping(spec.get("os")).get("name") != "windows":
        pod_seccomp = as_mapping(pod_context.get("seccompProfile")).get("type")
        unset = [
            _name(c)
            for c in containers
            if as_mapping(_context(c).get("seccompProfile")).get("type") not in _SECCOMP_OK
            and not (
                as_mapping(_context(c).get("seccompProfile")).get("type") is None
                and pod_seccomp in _SECCOMP_OK
            )
        ]
        if unset:
            yield (
                "seccompProfile (pod or containers "
                f"{', '.join(repr(n) for n in unset)} must set RuntimeDefault or Localhost)"
            )
        not_dropped = [
            _name(c)
            for c in containers
            if "ALL" not in as_list(as_mapping(_context(c).get("capabilities")).get("drop"))
        ]
        if not_dropped:
            yield f"unrestricted capabilities (drop ALL: {_containers_named(not_dropped)})"
        added = {
            str(cap)
            for c in containers
            for cap in as_list(as_mapping(_context(c).get("capabilities")).get("add"))
        }
        if extra := sorted(added - {"NET_BIND_SERVICE"}):
            yield f"unrestricted capabilities (added: {', '.join(extra)})"


def _containers(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [c for group in _CONTAINER_GROUPS for c in dicts_in(spec.get(group))]


def _context(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_mapping(container.get("securityContext"))


def _name(container: Mapping[str, Any]) -> str:
    return str(container.get("name"))


def _containers_named(names: list[str]) -> str:
    return _quoted("container", names)


def _quoted(what: str, names: list[str]) -> str:
    plural = "s" if len(names) > 1 else ""
    return f"{what}{plural} " + ", ".join(f'"{n}"' for n in names)
