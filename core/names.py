"""The rules for names that reach a rack host as they are: interface names (Linux and FreeBSD)
and host addresses. The experiment schema (trials/fields.py) and the inventory check
(core/inventory.py) read them from here, with the words that say what is allowed."""

from __future__ import annotations

import ipaddress
import re

# Linux: at most 15 bytes (IFNAMSIZ 16 with its NUL), no '/', ':' or whitespace; FreeBSD: the
# same IFNAMSIZ, and ipfw reads a `via` argument starting with a digit as an address and '*'
# as a pattern. What both take and no shell reads: a letter, then letters, digits, _ . -
INTERFACE_PATTERN = r"[A-Za-z][A-Za-z0-9_.-]{0,14}"
INTERFACE_RULE = (
    "a letter, then up to 14 letters, digits, _, . or - (Linux and FreeBSD: 15 characters)"
)
ADDRESS_PATTERN = r"[0-9A-Za-z_.:-]+"
ADDRESS_RULE = (
    "an IPv4/IPv6 address or a DNS name (labels of letters, digits, - and _, at most 253 "
    "characters)"
)
_DNS_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_DNS_NAME = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*\.?")


def is_interface_name(text: object) -> bool:
    return isinstance(text, str) and re.fullmatch(INTERFACE_PATTERN, text) is not None


def is_ip_address(text: object) -> bool:
    try:
        ipaddress.ip_address(text)  # type: ignore[arg-type]
    except ValueError:
        return False
    return isinstance(text, str)


def is_address_or_dns_name(text: object) -> bool:
    """An IP address, or a DNS name (what has a ':' or only digits and dots must be an
    address)."""
    if not isinstance(text, str) or not re.fullmatch(ADDRESS_PATTERN, text):
        return False
    if ":" in text or re.fullmatch(r"[0-9.]+", text):
        return is_ip_address(text)
    return len(text) <= 253 and bool(_DNS_NAME.fullmatch(text))
