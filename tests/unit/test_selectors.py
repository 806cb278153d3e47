"""Label selectors in Kubernetes' string form, as both programs read them: the webhook
converts the pods its --pod-selector selects, and the descheduler moves a pod with a
controller only when that same --pod-selector selects it (its replacement must pass the
webhook). One grammar for both (tensile.contracts.selectors), apimachinery's labels.Parse."""

from __future__ import annotations

import pytest

from descheduler import cli as descheduler_cli
from tensile.serving.flags import UsageError
from webhook import cli as webhook_cli

SELECTORS = [
    "virtual-pod=true",
    "tier in (a, b),!legacy",
    "tier notin ()",  # labels.Parse: "()" is the set of the empty value
    "cores>8",  # and Gt/Lt, which it also parses
    "Example.com/team=x",  # a key prefix must be a lower-case DNS subdomain
    "a b",
    "",
]
LABELS = [{}, {"virtual-pod": "true"}, {"tier": ""}, {"tier": "b"}, {"cores": "16"}]


def _webhook(text: str) -> object:
    try:
        return webhook_cli.parse([f"--pod-selector={text}"], env={}).mutation.pod_selector
    except UsageError:
        return None


def _descheduler(text: str) -> object:
    try:
        return descheduler_cli.parse([f"--pod-selector={text}"])[0].criteria.pod_selector
    except UsageError:
        return None


@pytest.mark.parametrize("text", SELECTORS)
def test_both_programs_read_a_pod_selector_alike(text: str) -> None:
    by_webhook, by_descheduler = _webhook(text), _descheduler(text)
    assert (by_webhook is None) == (by_descheduler is None), (by_webhook, by_descheduler)
    if by_webhook is not None:
        for labels in LABELS:
            assert by_webhook.matches(labels) == by_descheduler.matches(labels), labels  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "accepted"),
    [("tier notin ()", True), ("cores>8", True), ("Example.com/team=x", False), ("a b", False)],
)
def test_the_grammar_is_kubernetes(text: str, accepted: bool) -> None:
    assert (_descheduler(text) is not None) is accepted
