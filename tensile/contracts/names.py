"""The name syntaxes the apiserver accepts (apimachinery `validation`: IsDNS1123Label,
IsDNS1123Subdomain, IsDNS1035Label), so a name from a flag is refused at start with a
message rather than by the apiserver later (pure)."""

from __future__ import annotations

import re

from tensile.contracts.labels import is_label_value

_DNS1123_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(
    r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
)
_DNS1035_LABEL = re.compile(r"[a-z](?:[-a-z0-9]*[a-z0-9])?")
LABEL_MAX = 63
SUBDOMAIN_MAX = 253


def is_dns1123_label(text: str) -> bool:
    """Tell whether `text` is a DNS-1123 label: at most 63 lower-case alphanumerics and '-',
    alphanumeric at both ends (namespace names)."""
    return len(text) <= LABEL_MAX and _DNS1123_LABEL.fullmatch(text) is not None


def is_dns1123_subdomain(text: str) -> bool:
    """Tell whether `text` is a DNS-1123 subdomain: DNS-1123 labels joined by '.', at most
    253 characters (names of Secrets, ConfigMaps and most objects)."""
    return len(text) <= SUBDOMAIN_MAX and _DNS1123_SUBDOMAIN.fullmatch(text) is not None


def is_dns1035_label(text: str) -> bool:
    """Tell whether `text` is a DNS-1035 label: a DNS-1123 label that starts with a letter
    (Service names)."""
    return len(text) <= LABEL_MAX and _DNS1035_LABEL.fullmatch(text) is not None


_QUALIFIED_NAME_PART = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")


def qualified_name_problem(text: str) -> str | None:
    """Return why `text` is not a qualified name (apimachinery IsQualifiedName: label and
    annotation keys, an optional DNS-1123 subdomain prefix and '/', then a name of at most
    63 alphanumerics, '-', '_' and '.', alphanumeric at both ends), or None."""
    prefix, slash, name = text.rpartition("/")
    if slash and not prefix:
        return "the prefix before '/' is empty"
    if slash and not is_dns1123_subdomain(prefix):
        return (
            f"the prefix {prefix!r} is not a DNS-1123 subdomain (lower-case alphanumerics, '-' "
            f"and '.', at most {SUBDOMAIN_MAX} characters)"
        )
    if not name:
        return "the name part is empty"
    if len(name) > LABEL_MAX:
        return f"the name part {name!r} is longer than {LABEL_MAX} characters"
    if _QUALIFIED_NAME_PART.fullmatch(name) is None:
        return (
            f"the name part {name!r} may hold only alphanumerics, '-', '_' and '.', and must "
            "start and end with an alphanumeric"
        )
    return None


def label_value_problem(text: str) -> str | None:
    """Return why `text` is not a label value (apimachinery IsValidLabelValue: empty, or
    at most 63 alphanumerics, '-', '_' and '.', alphanumeric at both ends), or None."""
    if len(text) > LABEL_MAX:
        return f"{text!r} is longer than {LABEL_MAX} characters"
    if not is_label_value(text):
        return (
            f"{text!r} may hold only alphanumerics, '-', '_' and '.', and must start and end "
            "with an alphanumeric"
        )
    return None
