"""The webhook's own MutatingWebhookConfiguration learns which CA to trust: every webhook in
it gets `clientConfig.caBundle` = the bootstrapped CA (Kubernetes "Dynamic Admission
Control": the apiserver verifies the webhook's serving certificate against it)."""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping
from typing import Any

from tensile.kube.client import STRATEGIC_MERGE_PATCH, ApiClient
from tensile.kube.resources import Resource

logger = logging.getLogger(__name__)

MUTATING_WEBHOOK_CONFIGURATIONS = Resource(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="mutatingwebhookconfigurations",
    kind="MutatingWebhookConfiguration",
    namespaced=False,
)


async def publish(client: ApiClient, *, configuration: str, ca_pem: bytes) -> list[str]:
    """Set the caBundle of every webhook of MutatingWebhookConfiguration `configuration` to
    `ca_pem` where it differs; return the names of the webhooks changed (none: all trusted
    it already). A strategic-merge patch keyed by webhook name touches nothing else.

    Raises errors.ApiError (NotFound before the configuration is applied; Forbidden without
    get/patch on it) and errors.ApiUnavailable."""
    path = MUTATING_WEBHOOK_CONFIGURATIONS.path(name=configuration)
    current = await client.request("GET", path)
    bundle = base64.b64encode(ca_pem).decode()
    names = stale(current, ca_pem=ca_pem)
    if names:
        patch = {"webhooks": [{"name": n, "clientConfig": {"caBundle": bundle}} for n in names]}
        await client.request("PATCH", path, body=patch, content_type=STRATEGIC_MERGE_PATCH)
        logger.info(
            "MutatingWebhookConfiguration %s: caBundle set for %s", configuration, ", ".join(names)
        )
    return names


def stale(configuration: Mapping[str, Any], *, ca_pem: bytes) -> list[str]:
    """Return the names of the webhooks of a MutatingWebhookConfiguration object whose
    caBundle is not `ca_pem` (pure)."""
    bundle = base64.b64encode(ca_pem).decode()
    return [
        str(webhook["name"])
        for webhook in configuration.get("webhooks") or []
        if isinstance(webhook, Mapping)
        and webhook.get("name")
        and (webhook.get("clientConfig") or {}).get("caBundle") != bundle
    ]
