"""The CLI's human output: rich tables drawn from the dicts of ``_inspect.py``."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ._inspect import NOT_LOCKS

__all__ = ("object_view", "objects_table", "seconds")


def seconds(value: float | None) -> str:
    """A lease or timeout for a table: ``12.345 s``, or ``-`` for none."""
    return "-" if value is None else f"{value:.3f} s"


def _who(entry: dict[str, Any]) -> tuple[str, str]:
    """A holder's client, and its thread/task number or owner, as the table shows them."""
    if entry["client"] is None:
        return entry["id"], "-"
    # aiolock's holders: the host and pid their connection is named with.
    client = entry["client"]
    if "host" in entry:
        client = f"{client} ({entry['host']} pid {entry['pid']}, {entry['address']})"
    if entry["owner"] is not None:
        return client, f"owner {entry['owner']}"
    return client, str(entry["thread"])


def _summary(info: dict[str, Any]) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("name", info["name"])
    if info["key"] != info["name"]:
        table.add_row("key", info["key"])
    table.add_row("kind", info["kind_text"])
    for field, label in (
        ("mode", "mode"),
        ("fencing_token", "fencing token"),
        ("permits", "permits available"),
        ("count", "count"),
    ):
        if field in info:
            table.add_row(label, "-" if info[field] is None else str(info[field]))
    if info["kind"] == "semaphore_or_latch":
        table.add_row("note", "nobody waits on it: a semaphore's permits or a latch's count")
    if info["kind"] not in NOT_LOCKS:
        table.add_row("holders", str(len(info["holders"])))
    table.add_row("lease left", seconds(info["lease_left"]))
    if info["queue"]:
        table.add_row("queued", str(len(info["queue"])))
    if info.get("admitted"):
        table.add_row("readers let in, yet to hold", str(len(info["admitted"])))
    table.add_row("waiters subscribed", str(info["waiters_subscribed"]))
    return table


def _holders(info: dict[str, Any]) -> Table:
    sided = any("side" in h for h in info["holders"])
    table = Table(title="holders", title_justify="left")
    table.add_column("client")
    table.add_column("thread / task")
    if sided:
        table.add_column("side")
    table.add_column("count", justify="right")
    table.add_column("lease left", justify="right")
    for holder in info["holders"]:
        client, thread = _who(holder)
        row = [client, thread]
        if sided:
            row.append(holder.get("side", "-"))
        row += [str(holder["count"]), seconds(holder["lease_left"])]
        table.add_row(*row)
    return table


def _queue(info: dict[str, Any]) -> Table:
    sided = any("side" in w for w in info["queue"])
    counted = any("subscribed" in w for w in info["queue"])
    table = Table(title="queue", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("client")
    table.add_column("thread / task")
    if sided:
        table.add_column("side")
    table.add_column("timeout in", justify="right")
    if counted:
        table.add_column("subscribed", justify="right")
    for waiter in info["queue"]:
        client, thread = _who(waiter)
        row = [str(waiter["position"]), client, thread]
        if sided:
            row.append(waiter.get("side", "-"))
        row.append(seconds(waiter["timeout_in"]))
        if counted:
            row.append(str(waiter.get("subscribed", "-")))
        table.add_row(*row)
    return table


def _permits(info: dict[str, Any]) -> Table:
    table = Table(title="permits taken", title_justify="left")
    table.add_column("permit id")
    table.add_column("expires in", justify="right")
    for permit in info["acquired"]:
        expires = permit["expires_in"]
        table.add_row(permit["permit_id"], "no lease" if expires is None else seconds(expires))
    return table


def object_view(info: dict[str, Any]) -> RenderableType:
    """What ``inspect`` prints of one object."""
    parts: list[RenderableType] = [_summary(info)]
    if info["holders"]:
        parts.append(_holders(info))
    if info["queue"]:
        parts.append(_queue(info))
    if info.get("acquired"):
        parts.append(_permits(info))
    return Group(*parts)


def objects_table(found: list[dict[str, Any]], *, truncated: bool) -> RenderableType:
    """What ``list`` prints."""
    table = Table()
    table.add_column("name")
    table.add_column("kind")
    table.add_column("holders")
    table.add_column("lease left", justify="right")
    table.add_column("waiting", justify="right")
    for info in found:
        holders = ", ".join(
            ":".join(_who(h)) + (f" ({h['side']})" if "side" in h else "") for h in info["holders"]
        )
        if "permits" in info and info["kind"] != "count_down_latch":
            holders = holders or f"{info['permits']} permits available"
        elif "count" in info:
            holders = holders or f"count {info['count']}"
        # A fair lock's waiters are in its queue even while they are between subscriptions.
        waiting = max(info["waiters_subscribed"], len(info["queue"]))
        table.add_row(
            info["name"],
            info["kind_text"],
            holders or "-",
            seconds(info["lease_left"]),
            str(waiting),
        )
    if not truncated:
        return table
    return Group(table, Text("(more not shown: narrow the pattern or raise --limit)", style="dim"))
