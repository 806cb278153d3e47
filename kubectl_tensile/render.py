"""The reports of `status` and `why` as text for a terminal (at most `WIDTH` columns), or as
JSON or YAML for scripts (the report's data as it is). Pure."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from typing import Any

import yaml

from kubectl_tensile.status import short_duration
from tensile.contracts.labels import VIRTUAL_NODE_SELECTOR

WIDTH = 80
"""Columns of a terminal the text fits in."""
OUTPUTS = ("text", "json", "yaml")
_MIN_NODE_COLUMN = 8


def render(report: dict[str, Any], *, command: str, output: str) -> str:
    """Return `report` of `command` ("status" or "why") as `output` (one of `OUTPUTS`),
    ending in a newline. Raises ValueError for another output or command."""
    if output == "json":
        return json.dumps(report, indent=2, sort_keys=True) + "\n"
    if output == "yaml":
        return str(yaml.safe_dump(report, sort_keys=True, default_flow_style=False))
    if output != "text":
        raise ValueError(f"unknown output {output!r} (one of {', '.join(OUTPUTS)})")
    if command == "status":
        return status_text(report)
    if command == "why":
        return why_text(report)
    raise ValueError(f"unknown command {command!r}")


def clip(line: str, width: int = WIDTH) -> str:
    """Return `line` cut to `width` columns, ending in "..." when cut."""
    return line if len(line) <= width else line[: width - 3] + "..."


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, width: int = WIDTH) -> list[str]:
    """Return aligned lines (two spaces between columns) no wider than `width`: the first
    column is narrowed (its values clipped) when the others leave it too little room."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    rest = sum(widths[1:]) + 2 * (len(widths) - 1)
    widths[0] = min(widths[0], max(_MIN_NODE_COLUMN, width - rest))
    lines = []
    for row in [header, *rows]:
        cells = [clip(str(row[0]), widths[0]).ljust(widths[0])]
        cells += [str(c).ljust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append(clip("  ".join(cells).rstrip(), width))
    return lines


def _heartbeat(lower: dict[str, Any]) -> str:
    age = lower.get("heartbeatAgeSeconds")
    return "-" if age is None else short_duration(age)


def _lower(lower: dict[str, Any]) -> str:
    readyz = lower.get("readyz")
    if readyz is None:
        return str(lower["state"])
    return f"{lower['state']}/{'readyz ok' if readyz == 'ok' else 'readyz failed'}"


def status_text(report: dict[str, Any]) -> str:
    """The `status` table, then the pending moves, one per line."""
    rows = [
        (
            node["name"],
            _lower(node["lower"]),
            _heartbeat(node["lower"]),
            f"{node['used']['cpu']}/{node['free']['cpu']}",
            f"{node['used']['memory']}/{node['free']['memory']}",
            f"{node['pods']}/{node['allocatable']['pods']}",
            str(node["pendingMoves"]),
        )
        for node in report["nodes"]
    ]
    if not rows:
        return f"No virtual nodes (nodes labelled {VIRTUAL_NODE_SELECTOR}).\n"
    header = ("NODE", "LOWER", "BEAT", "CPU USED/FREE", "MEM USED/FREE", "PODS", "MOVES")
    lines = table(header, rows)
    moves = report["pendingMoves"]
    for node in report["nodes"]:
        lower = node["lower"]
        if lower["state"] != "ok" and lower.get("message"):
            lines.append(clip(f"{node['name']}: {lower['reason']}: {lower['message']}"))
        if lower.get("readyz") not in (None, "ok"):
            lines.append(clip(f"{node['name']}: lower /readyz: {lower['readyz']}"))
    if any(moves.values()):
        lines.append("")
        lines.append("Pending moves:")
    for item in moves["unplaceable"]:
        waited = "" if item["forSeconds"] is None else f" {short_duration(item['forSeconds'])}"
        lines.append(clip(f"  {item['pod']} on {item['node']}: unplaceable below{waited}"))
    for item in moves["avoidances"]:
        left = short_duration(item["remainingSeconds"])
        lines.append(clip(f"  {item['owner']} avoids {item['node']} for {left} more"))
    for item in moves["reCreations"]:
        replaced = f" (replaces {item['replaces']})" if item["replaces"] else ""
        lines.append(clip(f"  {item['pod']} being re-created{replaced}"))
    return "\n".join(lines) + "\n"


def _wrapped(label: str, sentences: Sequence[str]) -> list[str]:
    lines = [f"{label}:"] if sentences else []
    for sentence in sentences:
        lines += textwrap.wrap(
            sentence, width=WIDTH, initial_indent="  - ", subsequent_indent="    "
        )
    return lines


def _event_lines(label: str, events: Sequence[dict[str, Any]]) -> list[str]:
    if not events:
        return [f"{label}: none"]
    lines = [f"{label}:"]
    for event in events:
        age = "?" if event["age"] is None else short_duration(event["age"])
        times = f" (x{event['count']})" if event["count"] > 1 else ""
        lines.append(
            clip(f"  {age:>4}  {event['type']:<7} {event['reason']}: {event['message']}{times}")
        )
    return lines


def why_text(report: dict[str, Any]) -> str:
    """The `why` explanation: where, below, the webhook's and descheduler's doing, Events."""
    place = report["placement"]
    lines = [f"Pod {report['pod']}"]
    lines += textwrap.wrap(
        place["reason"], width=WIDTH, initial_indent="  ", subsequent_indent="  "
    )
    lower = report["lower"]
    if lower is None:
        if place["node"] and place["state"] not in ("not-virtual",):
            lines.append(clip(f"Lower: not read (add --lower {place['node']}=KUBECONFIG)"))
    elif "error" in lower:
        lines.append(clip(f"Lower: cannot read: {lower['error']}"))
    elif lower["pod"] is None:
        lines.append("Lower: no lower pod for it")
    else:
        lines.append(
            clip(f"Lower: pod {lower['pod']} on node {lower['node'] or '-'} ({lower['phase']})")
        )
    lines += _wrapped("Webhook", report["webhook"])
    lines += _wrapped("Descheduler", report["descheduler"])
    lines += _wrapped("Avoidances", report["avoidances"])
    lines += _event_lines("Events", report["events"])
    if lower is not None and lower.get("pod"):
        lines += _event_lines("Lower events", lower["events"])
    return "\n".join(lines) + "\n"
