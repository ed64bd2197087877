"""DiffServ code points: the names an experiment file may use (RFC 2474 class selectors,
RFC 2597 assured forwarding, RFC 3246 expedited forwarding) and their 6-bit values. The same
table serves the schema (names in), the marking role (numbers out) and the analysis (a
number seen in a capture shown by its name)."""

from __future__ import annotations

import json

DSCP_NAMES: dict[str, int] = {
    **{f"cs{i}": 8 * i for i in range(8)},
    **{f"af{c}{d}": 8 * c + 2 * d for c in range(1, 5) for d in range(1, 4)},
    "ef": 46,
    "be": 0,
}
# One name per value for display: cs0 is shown as be, AF and EF before the class selectors.
_SHOWN = {v: n for n, v in reversed(list(DSCP_NAMES.items()))} | {0: "be"}


def af_code_points(af_class: int) -> tuple[int, int, int]:
    """The DSCPs of AF<af_class>1, 2 and 3: what a marker of that class writes for drop
    precedence 1, 2 and 3 (AF11 = 10, AF12 = 12, AF13 = 14)."""
    return tuple(DSCP_NAMES[f"af{af_class}{p}"] for p in (1, 2, 3))  # type: ignore[return-value]


def parse_dscp(value: object) -> int:
    """0..63 or a name (ef, af11, cs1, be; any case) -> the 6-bit code point."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 63:
        return value
    if isinstance(value, str) and value.lower() in DSCP_NAMES:
        return DSCP_NAMES[value.lower()]
    raise ValueError(f"{value!r} is not a DSCP; give 0..63 or one of: {', '.join(DSCP_NAMES)}")


def dscp_name(value: int) -> str:
    """The code point's name (af11, ef, cs1, be), or its number when it has none."""
    return _SHOWN.get(int(value), str(int(value)))


def nft_rule_counters(listing: str) -> dict[str, dict[str, int]]:
    """Per rule (by its comment, the rule's name) of an `nft -j list table` listing: the
    packets and bytes its counter holds and the DSCP it sets."""
    out: dict[str, dict[str, int]] = {}
    for item in json.loads(listing).get("nftables", []):
        rule = item.get("rule")
        if not rule or "comment" not in rule:
            continue
        counts: dict[str, int] = {}
        for expr in rule.get("expr", []):
            if "counter" in expr:
                counts.update(packets=expr["counter"]["packets"], bytes=expr["counter"]["bytes"])
            mangle = expr.get("mangle", {})
            if mangle.get("key", {}).get("payload", {}).get("field") == "dscp":
                counts["dscp"] = parse_dscp(mangle["value"])
        out[rule["comment"]] = counts
    return out


def counter_delta(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """What each rule counted between two listings (a rule new since `before` from zero)."""
    return {
        name: {
            **now,
            "packets": now.get("packets", 0) - before.get(name, {}).get("packets", 0),
            "bytes": now.get("bytes", 0) - before.get(name, {}).get("bytes", 0),
        }
        for name, now in after.items()
    }
