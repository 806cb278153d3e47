"""The provider-facing error vocabulary (virtual-kubelet's errdefs, in our words).

Providers raise these; the pod controller turns them into upper pod statuses and events.
"""

from __future__ import annotations


class ProviderError(Exception):
    """A provider could not do what was asked; the message is shown to users as is."""


class InvalidPod(ProviderError):
    """The backend refused the pod as it is (invalid, denied by admission, over quota).

    Retrying unchanged is unlikely to help quickly, so retries back off further.
    """


class MissingDependency(ProviderError):
    """Something the pod needs (a ConfigMap, Secret, a key of one, a ServiceAccount) is missing.

    `kind`, `namespace`, `name` and `key` (None: the whole object) say what; `volume` names
    the pod volume that needs it (None: a container's env or envFrom). The message is a
    kubelet's wording (`configmap "app" not found`, `couldn't find key k in Secret ns/s`),
    which users see on the waiting container. The pod is retried until it appears.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        namespace: str,
        name: str,
        key: str | None = None,
        volume: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.namespace = namespace
        self.name = name
        self.key = key
        self.volume = volume

    @property
    def reason(self) -> str:
        """The Event reason virtual-kubelet records for it (`MandatoryConfigMapNotFound`,
        `MandatorySecretKeyNotFound`, ...; see virtual-kubelet's node/env.go)."""
        return f"Mandatory{self.kind}{'Key' if self.key is not None else ''}NotFound"


class BackendUnavailable(ProviderError):
    """The backend (the lower cluster) cannot be reached right now."""


class PodNotFound(ProviderError):
    """The provider has no such pod or container (answered as 404)."""
