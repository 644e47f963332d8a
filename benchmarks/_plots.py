"""PNG plots of the contended and handoff cases (matplotlib, Agg backend).

matplotlib is imported dynamically: it is in the ``bench`` group only, and the type checker
runs in environments without it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ("plot",)

_SINGLE = (("N=2", 2), ("N=16", 16), ("N=64", 64))
_MULTI = ("4x8", 32)


def _series(rows: Sequence[Mapping[str, Any]], case: str, impl: str, metric: str) -> list[Any]:
    points = []
    for variant, n in _SINGLE:
        for row in rows:
            if (row["case"], row["variant"], row["impl"]) == (case, variant, impl):
                value = row.get(metric)
                if row.get("status") == "ok" and isinstance(value, int | float) and value > 0:
                    points.append((n, value))
    return points


def _multi_point(
    rows: Sequence[Mapping[str, Any]], impl: str, metric: str
) -> tuple[int, float] | None:
    for row in rows:
        if (row["case"], row["variant"], row["impl"]) == ("contended", _MULTI[0], impl):
            value = row.get(metric)
            if row.get("status") == "ok" and isinstance(value, int | float) and value > 0:
                return (_MULTI[1], float(value))
    return None


def plot(
    rows: Sequence[Mapping[str, Any]], impls: Mapping[str, Mapping[str, str]], out_dir: Path
) -> list[Path]:
    """Owner changes/s and wait p99 against N, and handoff latency; returns the files."""
    try:
        mpl: Any = importlib.import_module("matplotlib")
        mpl.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError as exc:
        print(f"no plots: {exc}")
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    keys = [k for k in impls if any(r["impl"] == k and r["case"] == "contended" for r in rows)]
    for metric, title, ylabel, fname in (
        ("owner_changes_per_s", "Owner changes per second, one lock", "owner changes/s",
         "owner_changes_vs_n.png"),
        ("wait_p99_ms", "Wait time p99, one lock", "wait p99 (ms)", "wait_p99_vs_n.png"),
    ):  # fmt: skip
        if not any(_series(rows, "contended", k, metric) for k in keys):
            continue
        fig, ax = plt.subplots(figsize=(9, 5.5))
        for i, key in enumerate(keys):
            color = f"C{i % 10}"
            pts = _series(rows, "contended", key, metric)
            if pts:
                ax.plot(*zip(*pts, strict=True), "o-", color=color, label=impls[key]["label"])
            multi = _multi_point(rows, key, metric)
            if multi:
                ax.plot(*multi, "s", color=color, mfc="none", ms=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks([2, 16, 32, 64], ["2", "16", "4x8\n(4 processes)", "64"])
        ax.set_xlabel("contending tasks N (one process; hollow squares: 4 processes x 8)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(visible=True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        path = out_dir / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    handoff = [
        r
        for r in rows
        if r["case"] == "handoff" and r.get("status") == "ok" and r.get("handoff_p50_ms")
    ]
    if handoff:
        fig, ax = plt.subplots(figsize=(9, 5.5))
        labels = [f"{impls[r['impl']]['label']}  {r['variant']}" for r in handoff]
        p50 = [float(r["handoff_p50_ms"]) for r in handoff]
        p99 = [float(r.get("handoff_p99_ms") or 0.0) for r in handoff]
        ys = range(len(handoff))
        ax.barh([y + 0.2 for y in ys], p99, height=0.4, label="p99", color="C1")
        ax.barh([y - 0.2 for y in ys], p50, height=0.4, label="p50", color="C0")
        ax.set_yticks(list(ys), labels, fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("handoff latency (ms): release call -> next waiter's acquire returns")
        ax.set_title("Forced handoff latency")
        ax.legend()
        ax.grid(visible=True, axis="x", which="both", alpha=0.3)
        fig.tight_layout()
        path = out_dir / "handoff_latency.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    written += _plot_redisson(plt, rows, out_dir)
    return written


def _value(
    rows: Sequence[Mapping[str, Any]], case: str, variant: str, impl: str, metric: str
) -> float | None:
    for row in rows:
        if (row["case"], row["variant"], row["impl"]) == (case, variant, impl):
            value = row.get(metric)
            if row.get("status") == "ok" and isinstance(value, int | float):
                return float(value)
    return None


def _plot_redisson(plt: Any, rows: Sequence[Mapping[str, Any]], out_dir: Path) -> list[Path]:
    """aiolock ÷ Redisson (Java) per case with the goals, and each side's round trips and
    server commands per acquisition (``redisson_vs_aiolock.png``); nothing without Redisson."""
    from ._report import REDISSON_CASES  # noqa: PLC0415  (the report's case list)

    cases = [c for c in REDISSON_CASES if _value(rows, c[1], c[2], "redisson", c[3])]
    if not cases:
        return []
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    xs = range(len(cases))
    for shift, impl, label, color in (
        (-0.2, "aiolock", "aiolock Lock", "C0"),
        (0.2, "aiolock-sync", "aiolock.sync (threads)", "C2"),
    ):
        heights = []
        for _, case, variant, metric, _ in cases:
            mine = _value(rows, case, variant, impl, metric)
            theirs = _value(rows, case, variant, "redisson", metric)
            heights.append(mine / theirs if mine is not None and theirs else 0.0)
        left.bar([x + shift for x in xs], heights, width=0.4, label=label, color=color)
    for x, (_, _, _, _, goal) in zip(xs, cases, strict=True):
        if goal:
            left.hlines(goal, x - 0.45, x + 0.45, colors="k", linestyles="dashed")
    left.axhline(1.0, color="grey", linewidth=0.8)
    left.set_yscale("log")  # ratios from below 1 to tens
    left.set_xticks(list(xs), [c[0] for c in cases], fontsize=8, rotation=15)
    left.set_ylabel("aiolock ÷ Redisson (pairs/s or owner changes/s)")
    left.set_title("aiolock against Redisson (dashed: the goal)")
    left.legend(fontsize=8)
    width = 0.2
    for offset, impl, metric, label, color in (
        (-1.5, "aiolock", "round_trips_per_op", "aiolock round trips", "C0"),
        (-0.5, "redisson", "round_trips_per_op", "Redisson round trips", "C3"),
        (0.5, "aiolock", "server_cmds_per_op", "aiolock server cmds", "C9"),
        (1.5, "redisson", "server_cmds_per_op", "Redisson server cmds", "C1"),
    ):
        heights = [_value(rows, c[1], c[2], impl, metric) or 0.0 for c in cases]
        right.bar([x + offset * width for x in xs], heights, width=width, label=label, color=color)
    right.set_xticks(list(xs), [c[0] for c in cases], fontsize=8, rotation=15)
    right.set_ylabel("per acquisition")
    right.set_title("Round trips and server commands per acquisition")
    right.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "redisson_vs_aiolock.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
