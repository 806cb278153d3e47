"""The `--policy-config-file`: tensile-kube's DeschedulerPolicy (pure parsing).

    apiVersion: descheduler/v1alpha1
    kind: DeschedulerPolicy
    strategies:
      PodLifeTime:
        enabled: true
        params:
          maxPodLifeTimeSeconds: 180

As in tensile-kube (sigs.k8s.io/descheduler v0.18's format), PodLifeTime is the strategy
that acts: pods Pending on a virtual node longer than maxPodLifeTimeSeconds move. The other
strategies of that version are recognised and, when enabled, reported as ignored (they
rebalance real nodes; a virtual node has none below it to rebalance). The policy's
`nodeSelector`, `evictLocalStoragePods` and `maxNoOfPodsToEvictPerNode` are the flags'
defaults. Anything else -- a typo in a strategy name, a wrong type, a missing
maxPodLifeTimeSeconds -- is a `PolicyError` naming the file and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import yaml

API_VERSION = "descheduler/v1alpha1"
KIND = "DeschedulerPolicy"
POD_LIFETIME = "PodLifeTime"
IGNORED_STRATEGIES = (
    "RemoveDuplicates",
    "LowNodeUtilization",
    "RemovePodsViolatingInterPodAntiAffinity",
    "RemovePodsViolatingNodeAffinity",
    "RemovePodsViolatingNodeTaints",
    "RemovePodsHavingTooManyRestarts",
    "RemovePodsViolatingTopologySpreadConstraint",
)
"""sigs.k8s.io/descheduler's other v1alpha1 strategies: accepted, never run."""
_TOP_LEVEL = ("apiVersion", "kind", "strategies", "nodeSelector", "evictLocalStoragePods",
              "maxNoOfPodsToEvictPerNode")  # fmt: skip
_STRATEGY_KEYS = ("enabled", "params")
T = TypeVar("T")


class PolicyError(ValueError):
    """The policy file cannot be used; the message names the file and the field."""


@dataclass(frozen=True, kw_only=True)
class Policy:
    """What the file asks for (None: not said, the flag's default applies)."""

    max_pod_lifetime: float | None = None
    """PodLifeTime's maxPodLifeTimeSeconds when the strategy is enabled."""
    node_selector: str | None = None
    evict_local_storage_pods: bool | None = None
    max_pods_per_node: int | None = None
    warnings: tuple[str, ...] = field(default=())
    """Things worth a log line (enabled strategies that do nothing here)."""


def load(path: str) -> Policy:
    """Read and parse the policy file at `path`. Raises PolicyError (also for an unreadable
    file)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"policy file {path}: cannot read it: {exc}") from exc
    return parse(text, source=path)


def parse(text: str, *, source: str = "policy") -> Policy:
    """Parse a DeschedulerPolicy document. Raises PolicyError."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source}: not valid YAML: {_one_line(exc)}") from exc
    if not isinstance(document, Mapping):
        raise PolicyError(f"{source}: expected a DeschedulerPolicy object, got {_kind(document)}")
    unknown = sorted(str(k) for k in document if k not in _TOP_LEVEL)
    if unknown:
        raise PolicyError(f"{source}: unknown field(s) {', '.join(unknown)}")
    if document.get("apiVersion") != API_VERSION or document.get("kind") != KIND:
        raise PolicyError(
            f"{source}: expected apiVersion {API_VERSION} and kind {KIND}, got "
            f"{document.get('apiVersion')!r} and {document.get('kind')!r}"
        )
    strategies = document.get("strategies") or {}
    if not isinstance(strategies, Mapping):
        raise PolicyError(f"{source}: strategies must be a map of strategy names")
    lifetime: float | None = None
    warnings: list[str] = []
    for name, strategy in strategies.items():
        where = f"{source}: strategies.{name}"
        enabled, params = _strategy(strategy, where=where)
        if name == POD_LIFETIME:
            if enabled:
                lifetime = _lifetime(params, where=where)
        elif name in IGNORED_STRATEGIES:
            if enabled:
                warnings.append(f"{where} is enabled but does nothing for virtual nodes; ignored")
        else:
            known = ", ".join((POD_LIFETIME, *IGNORED_STRATEGIES))
            raise PolicyError(f"{where}: unknown strategy (known: {known})")
    return Policy(
        max_pod_lifetime=lifetime,
        node_selector=_optional(document, "nodeSelector", str, source=source),
        evict_local_storage_pods=_optional(document, "evictLocalStoragePods", bool, source=source),
        max_pods_per_node=_count(document, source=source),
        warnings=tuple(warnings),
    )


def _strategy(strategy: object, *, where: str) -> tuple[bool, Mapping[str, Any]]:
    if strategy is None:
        return False, {}
    if not isinstance(strategy, Mapping):
        raise PolicyError(f"{where}: expected a map with enabled and params")
    unknown = sorted(str(k) for k in strategy if k not in _STRATEGY_KEYS)
    if unknown:
        raise PolicyError(f"{where}: unknown field(s) {', '.join(unknown)}")
    enabled = strategy.get("enabled", False)
    if not isinstance(enabled, bool):
        raise PolicyError(f"{where}.enabled: expected true or false, got {enabled!r}")
    params = strategy.get("params") or {}
    if not isinstance(params, Mapping):
        raise PolicyError(f"{where}.params: expected a map")
    return enabled, params


def _lifetime(params: Mapping[str, Any], *, where: str) -> float:
    value = params.get("maxPodLifeTimeSeconds")
    if value is None:
        raise PolicyError(f"{where}.params.maxPodLifeTimeSeconds: required when enabled")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PolicyError(
            f"{where}.params.maxPodLifeTimeSeconds: expected a positive whole number of "
            f"seconds, got {value!r}"
        )
    return float(value)


def _optional(document: Mapping[str, Any], key: str, kind: type[T], *, source: str) -> T | None:
    value = document.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise PolicyError(f"{source}: {key}: expected a {kind.__name__}, got {value!r}")
    return value


def _count(document: Mapping[str, Any], *, source: str) -> int | None:
    value = _optional(document, "maxNoOfPodsToEvictPerNode", int, source=source)
    if value is not None and value < 0:
        raise PolicyError(f"{source}: maxNoOfPodsToEvictPerNode: must be >= 0, got {value}")
    return value


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
