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
    """Something the pod needs (a ConfigMap, Secret, ServiceAccount) does not exist yet."""


class BackendUnavailable(ProviderError):
    """The backend (the lower cluster) cannot be reached right now."""


class NotFound(ProviderError):
    """The provider has no such pod or container (answered as 404)."""
