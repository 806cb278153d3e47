"""Shared informers: one list+watch per cluster, resource and selection, however many
components read it (client-go's SharedInformerFactory).

A component asks the factory for the informer it needs; asking twice for the same cluster
(client), resource, namespace and selectors gives the same `Informer`, so its store is
shared and the apiserver serves one watch. Handlers and indexes are added by each
component (`Informer.add_handlers`, `Store.add_indexer`) before the informers run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tensile.contracts.objects import Obj
from tensile.kube.client import ApiClient
from tensile.kube.informer import Informer, compact
from tensile.kube.namespaced import NamespacedInformer, NamespaceSet
from tensile.kube.reflector import ReflectorSettings
from tensile.kube.resources import Resource

Transform = Callable[[Obj], Obj]


@dataclass(frozen=True)
class _Selection:
    client: ApiClient
    group: str
    version: str
    plural: str
    namespace: str | None
    label_selector: str | None
    field_selector: str | None
    namespaces: NamespaceSet | None


@dataclass(frozen=True)
class _Form:
    """How the shared store holds its objects; every sharer must agree on it."""

    transform: Transform | None
    encoded: bool


class InformerFactory:
    """Creates informers and hands out the one that exists for a selection."""

    def __init__(self, *, settings: ReflectorSettings | None = None) -> None:
        """`settings` time every reflector it creates (default `ReflectorSettings()`)."""
        self._settings = settings
        self._informers: dict[_Selection, tuple[Informer, _Form]] = {}

    def informer(
        self,
        client: ApiClient,
        resource: Resource,
        *,
        name: str | None = None,
        namespace: str | None = None,
        namespaces: NamespaceSet | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Transform | None = compact,
        encoded: bool = False,
    ) -> Informer:
        """Return the informer of `resource` through `client` (optionally one namespace, or
        the changing set `namespaces`, one watch each (`NamespacedInformer`), and
        selectors), creating it on first use; a fenced view of a client stands for that
        client (`ApiClient.unfenced`).

        `name` labels the first creation's metrics and tasks (default
        "<client name>-<plural>"). `transform` and `encoded` say how its store keeps objects
        (see `Informer`); a transform is compared with `==`, so share one that compares by
        value (a module function, or a frozen dataclass with `__call__`). Raises ValueError
        when the informer exists with another form: two components would otherwise read
        objects trimmed for the other.
        """
        # Fenced views of one client (`ApiClient.fenced`) share its informers: an informer
        # only reads, which no fence holds back.
        client = client.unfenced
        selection = _Selection(
            client,
            resource.group,
            resource.version,
            resource.plural,
            namespace,
            label_selector or None,
            field_selector or None,
            namespaces,
        )
        form = _Form(transform, encoded)
        found = self._informers.get(selection)
        if found is not None:
            shared, existing = found
            if existing != form:
                raise ValueError(
                    f"informer {shared.name} is shared with another cache form "
                    f"({existing} vs {form})"
                )
            return shared
        informer: Informer
        if namespaces is not None:
            informer = NamespacedInformer(
                client,
                resource,
                name=name or f"{client.name}-{resource.plural}",
                namespaces=namespaces,
                label_selector=label_selector,
                field_selector=field_selector,
                settings=self._settings,
                transform=transform,
                encoded=encoded,
            )
        else:
            informer = Informer(
                client,
                resource,
                name=name or f"{client.name}-{resource.plural}",
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                settings=self._settings,
                transform=transform,
                encoded=encoded,
            )
        self._informers[selection] = (informer, form)
        return informer

    def informers(self) -> list[Informer]:
        """Every informer created so far, in creation order."""
        return [informer for informer, _ in self._informers.values()]
