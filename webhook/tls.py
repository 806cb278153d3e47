"""What the webhook does with a bootstrapped serving certificate besides serving it
(`tensile.serving.bootstrap.SecretBootstrap`): publish its CA as the `caBundle` of the
webhook's own MutatingWebhookConfiguration, and export its expiry.

The configuration is watched (an informer on that one object), so a caBundle that is
missing or stale (the configuration created after the webhook, or replaced without it) is
set again at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from tensile.kube import errors
from tensile.kube.client import ApiClient
from tensile.kube.informer import Handlers, Informer
from tensile.serving import certsecret
from webhook import cabundle, metrics

logger = logging.getLogger(__name__)


class CaBundle:
    """A `tensile.serving.bootstrap.Publication`: the caBundle of MutatingWebhookConfiguration
    `configuration` ("" for none: only the expiry metric is kept)."""

    def __init__(self, client: ApiClient, *, configuration: str) -> None:
        self._client = client
        self._configuration = configuration
        self._authority: bytes | None = None
        self._wake: Callable[[], None] = lambda: None
        self._informers: tuple[Informer, ...] = ()
        if configuration:
            configurations = Informer(
                client,
                cabundle.MUTATING_WEBHOOK_CONFIGURATIONS,
                name="webhook-configuration",
                field_selector=f"metadata.name={configuration}",
            )
            configurations.add_handlers(
                Handlers(on_add=self._changed, on_update=lambda _old, new: self._changed(new))
            )
            self._informers = (configurations,)

    def informers(self) -> Sequence[Informer]:
        """The configuration's (none without one)."""
        return self._informers

    def on_stale(self, wake: Callable[[], None]) -> None:
        """Call `wake` when a webhook of the configuration does not trust the CA published."""
        self._wake = wake

    async def publish(self, bundle: certsecret.Bundle) -> None:
        """Export the serving certificate's expiry and set the caBundle where it differs
        (what fails is logged: the next check tries again)."""
        metrics.CERTIFICATE_EXPIRY.set(bundle.serving.certificate.not_valid_after_utc.timestamp())
        configuration = self._configuration
        if not configuration:
            return
        self._authority = bundle.authority.cert_pem
        try:
            await cabundle.publish(
                self._client, configuration=configuration, ca_pem=bundle.authority.cert_pem
            )
        except errors.NotFound:
            logger.warning(
                "webhook: MutatingWebhookConfiguration %s not found yet; its caBundle is set "
                "once it exists",
                configuration,
            )
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            logger.warning("webhook: cannot set the caBundle of %s: %s", configuration, exc)

    def _changed(self, configuration: dict[str, object]) -> None:
        """Informer handler: only looks (the source's `keep` does the writing)."""
        if self._authority is None:
            return
        if cabundle.stale(configuration, ca_pem=self._authority):
            self._wake()
