"""The name syntaxes the apiserver accepts (apimachinery `validation`: IsDNS1123Label,
IsDNS1123Subdomain, IsDNS1035Label), so a name from a flag is refused at start with a
message rather than by the apiserver later (pure)."""

from __future__ import annotations

import re

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
