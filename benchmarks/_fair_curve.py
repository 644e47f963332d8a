"""The fair lock's cost against the number of waiters: N = 1, 2, 4, 16, 64 tasks on one lock.

Redisson's fair lock keeps a queue of waiters and, per waiter, a timeout in a sorted set; a
grant moves every queued waiter's timeout (the layout is fixed by interop), so server work
per acquisition grows with the queue. This measures that curve: server commands and round
trips per acquisition (counts, which load does not change) and acquisitions/s, for the fair
lock and for the plain lock beside it, interleaved per repetition as the other cases are.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._cases import Job, Scenario, measure

__all__ = ("FAIR_IMPLS", "FAIR_NS", "fair_curve_markdown", "plot_fair_curve", "run_fair_curve")

FAIR_NS = (1, 2, 4, 16, 64)
FAIR_IMPLS = ("aiolock-fair", "aiolock")
_METRICS = (
    ("server_cmds_per_op", "server cmds/acq", 1),
    ("round_trips_per_op", "round trips/acq", 2),
    ("acq_per_s", "acq/s", 0),
    ("server_cpu_us_per_op", "server CPU µs/acq", 0),
    ("wait_p99_ms", "wait p99 ms", 2),
)

Progress = Callable[[dict[str, Any], Scenario], str]


def run_fair_curve(
    *,
    url: str,
    impls: Mapping[str, Mapping[str, Any]],
    reps: int,
    duration: float,
    run_id: str,
    progress: Progress,
) -> list[dict[str, Any]]:
    """One row per (N, implementation, repetition)."""
    keys = [k for k in FAIR_IMPLS if k in impls and not impls[k]["status"]]
    runs: list[dict[str, Any]] = []
    for n in FAIR_NS:
        scen = Scenario("contended", f"N={n}", n)
        print(f"== fair lock curve: N={n}", flush=True)
        for rep in range(reps):
            shift = rep % max(1, len(keys))
            for key in keys[shift:] + keys[:shift]:
                tag = f"bench:{run_id}:fair:{n}:{key}:{rep}"
                metrics = measure(Job(key, url, tag, scen, duration))
                print(f"  rep {rep + 1}/{reps} {key}: {progress(metrics, scen)}", flush=True)
                runs.append({"n": n, "impl": key, "rep": rep, **metrics})
    return runs


def _median(runs: Sequence[Mapping[str, Any]], n: int, impl: str, metric: str) -> float | None:
    values = [
        float(r[metric])
        for r in runs
        if r["n"] == n
        and r["impl"] == impl
        and r.get("status") == "ok"
        and isinstance(r.get(metric), int | float)
    ]
    return statistics.median(values) if values else None


def _spread(runs: Sequence[Mapping[str, Any]], n: int, impl: str, metric: str) -> str:
    values = [
        float(r[metric])
        for r in runs
        if r["n"] == n and r["impl"] == impl and r.get("status") == "ok" and r.get(metric)
    ]
    if not values:
        return "-"
    digits = 2 if max(values) < 100 else 0
    med, low, high = statistics.median(values), min(values), max(values)
    return f"{med:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"


def fair_curve_markdown(runs: Sequence[Mapping[str, Any]]) -> str:
    """The curve as a table: per N, the fair lock beside the plain lock."""
    if not runs:
        return ""
    impls = list(dict.fromkeys(r["impl"] for r in runs))
    lines = [
        "",
        "## Fair lock against N (one lock, N tasks; medians, min-max for acq/s)",
        "",
        "| N | implementation | server cmds/acq | round trips/acq | acq/s | server CPU µs/acq "
        "| wait p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in FAIR_NS:
        for impl in impls:
            cells = []
            for metric, _, digits in _METRICS:
                if metric == "acq_per_s":
                    cells.append(_spread(runs, n, impl, metric))
                    continue
                value = _median(runs, n, impl, metric)
                cells.append("-" if value is None else f"{value:,.{digits}f}")
            lines.append(f"| {n} | {impl} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_fair_curve(runs: Sequence[Mapping[str, Any]], out_dir: Path) -> list[Path]:
    """Server commands per acquisition and acquisitions/s against N (log-log)."""
    import importlib  # noqa: PLC0415 - matplotlib is in the bench group only

    try:
        mpl: Any = importlib.import_module("matplotlib")
        mpl.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return []
    if not runs:
        return []
    impls = list(dict.fromkeys(r["impl"] for r in runs))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (metric, label) in zip(
        axes,
        (("server_cmds_per_op", "server commands per acquisition"), ("acq_per_s", "acq/s")),
        strict=True,
    ):
        for impl in impls:
            points = [(n, _median(runs, n, impl, metric)) for n in FAIR_NS]
            xs = [n for n, v in points if v]
            ys = [v for _, v in points if v]
            ax.plot(xs, ys, marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tasks on one lock (N)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("Fair lock cost against N")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "fair_lock_vs_n.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]
