"""Markdown tables, target ratios and the JSON file of one benchmark run."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = (
    "REDISSON_CASES",
    "Row",
    "headline",
    "markdown",
    "ratios",
    "redisson_markdown",
    "redisson_ratios",
    "targets",
    "write",
)

Row = dict[str, Any]  # one merged row: case, variant, impl + metrics
Value = float | int | str | None


def _num(value: Value, digits: int = 0) -> str:
    if value is None or isinstance(value, str):
        return "-" if value is None else value
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _ms(value: Value) -> str:
    if not isinstance(value, int | float):
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if value >= 1 else f"{value:.3f}"


def _ratio(num: Value, den: Value) -> float | None:
    if isinstance(num, int | float) and isinstance(den, int | float) and den:
        return float(num) / float(den)
    return None


def _find(rows: Sequence[Row], case: str, variant: str, impl: str) -> Row | None:
    for row in rows:
        if (row["case"], row["variant"], row["impl"]) == (case, variant, impl):
            return row
    return None


def _notes(row: Row, impl_note: str) -> str:
    bits: list[str] = []
    for key, label in (
        ("give_ups", "give-ups"),
        ("stragglers", "stragglers"),
        ("errors", "errors"),
        ("exclusion_violations", "EXCLUSION VIOLATIONS"),
    ):
        value = row.get(key)
        if isinstance(value, int | float) and value:
            bits.append(f"{label}: {value:,.0f}")
    if row.get("first_error"):
        bits.append(f"first error: {row['first_error']}")
    if row.get("aiolock_log"):
        bits.append(f"aiolock logged: {row['aiolock_log']}")
    if impl_note and row.get("status") == "ok":
        bits.append(impl_note)
    return "; ".join(bits)


def _table(header: Sequence[str], lines: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return out


def _rows_for(
    rows: Sequence[Row],
    impls: Mapping[str, Mapping[str, str]],
    case: str,
    cells: Callable[[Row], list[str]],
    width: int,
) -> list[list[str]]:
    lines: list[list[str]] = []
    for row in rows:
        if row["case"] != case:
            continue
        info = impls[row["impl"]]
        head = [info["label"], info["mode"], row["variant"]]
        if row.get("status") != "ok":
            lines.append([*head, str(row.get("status")), *[""] * (width - 4)])
        else:
            lines.append([*head, *cells(row), _notes(row, info.get("note", ""))])
    return lines


def markdown(result: Mapping[str, Any]) -> str:
    """The whole report as markdown."""
    meta = result["meta"]
    impls: Mapping[str, Mapping[str, str]] = result["impls"]
    rows: Sequence[Row] = result["summary"]
    env = meta["environment"]
    pkgs = ", ".join(f"{k} {v}" for k, v in env["packages"].items() if v)
    out = [
        "# aiolock benchmark results",
        "",
        f"- mode: {meta['mode']} ({meta['duration_s']} s per measurement, "
        f"{meta['reps']} interleaved repetition(s); medians shown), run took "
        f"{meta['elapsed_s']:.0f} s",
        f"- pinned: {_pinned(meta.get('pinned'))}; host steal over the run: "
        f"{_pct(meta.get('steal_pct'))} (per measurement: {_steal_range(result)})",
        f"- baseline: {_baseline(meta.get('baseline'))}",
        f"- server: {meta['server']['kind']} {meta['server']['server_name']} "
        f"{meta['server']['server_version']} (redis_version {meta['server']['redis_version']})"
        ", loopback",
        f"- Python {env['python']} ({env['implementation']}), {env['platform']}",
        f"- CPU: {env['cpu_model']}, {env['cpu_count']} cores",
        f"- packages: {pkgs}; aiolock imported from {meta.get('aiolock_from', 'not recorded')}",
        "",
        "Peers that could not run:",
        "",
    ]
    missing = [f"- {v['label']}: {v['status']}" for v in impls.values() if v.get("status")]
    out += [*(missing or ["- none"]), ""]

    if head := headline(result):
        out += [head, ""]
    floor = {v: _find(rows, "uncontended", v, "floor-2xevalsha") for v in ("1 task", "32 tasks")}
    out += ["## 1. Uncontended lock+unlock pairs", ""]
    header = ["implementation", "mode", "tasks", "pairs/s", "÷ 2xEVALSHA floor",
              "pair p50 ms", "pair p99 ms", "client CPU µs/pair", "server CPU µs/pair",
              "server cmds/pair", "round trips/pair", "notes"]  # fmt: skip

    def uncontended(row: Row) -> list[str]:
        base = floor.get(row["variant"])
        vs = _ratio(row.get("pairs_per_s"), base.get("pairs_per_s") if base else None)
        return [
            _num(row.get("pairs_per_s")),
            "-" if vs is None else f"{vs:.2f}",
            _ms(row.get("pair_p50_ms")),
            _ms(row.get("pair_p99_ms")),
            _num(row.get("client_cpu_us_per_op")),
            _num(row.get("server_cpu_us_per_op")),
            _num(row.get("server_cmds_per_op"), 2),
            _num(row.get("round_trips_per_op"), 2),
        ]

    out += _table(header, _rows_for(rows, impls, "uncontended", uncontended, len(header)))

    out += ["", "## 2. One lock, N contending tasks", ""]
    header = ["implementation", "mode", "N", "acq/s", "owner changes/s", "÷ ring",
              "immediate re-acq %", "per-task min-max", "wait p50 / p99 / max ms",
              "server cmds/acq", "round trips/acq", "client CPU µs/acq", "notes"]  # fmt: skip

    def contended(row: Row) -> list[str]:
        ring = _find(rows, row["case"], row["variant"], "ring")
        vs = _ratio(
            row.get("owner_changes_per_s"), ring.get("owner_changes_per_s") if ring else None
        )
        return [
            _num(row.get("acq_per_s")),
            _num(row.get("owner_changes_per_s")),
            "-" if vs is None else f"{vs:.2f}",
            _num(row.get("immediate_reacquire_pct"), 1),
            f"{_num(row.get('per_task_min'))}-{_num(row.get('per_task_max'))}",
            " / ".join(_ms(row.get(k)) for k in ("wait_p50_ms", "wait_p99_ms", "wait_max_ms")),
            _num(row.get("server_cmds_per_op"), 2),
            _num(row.get("round_trips_per_op"), 2),
            _num(row.get("client_cpu_us_per_op")),
        ]

    out += _table(header, _rows_for(rows, impls, "contended", contended, len(header)))
    out += ["", "Server commands per acquisition, by command (largest first):", ""]
    out += [
        f"- {impls[r['impl']]['label']} {r['variant']}: {r.get('server_cmds', '')}"
        for r in rows
        if r["case"] == "contended" and r.get("status") == "ok" and r["variant"] == "N=16"
    ]

    out += ["", "## 3. Forced handoff (a releaser queues again only after another took it)", ""]
    header = ["implementation", "mode", "N", "handoffs/s", "handoff p50 ms", "÷ ring p50",
              "handoff p99 ms", "wait p99 ms", "round trips/acq", "notes"]  # fmt: skip

    def handoff(row: Row) -> list[str]:
        ring = _find(rows, row["case"], row["variant"], "ring")
        vs = _ratio(row.get("handoff_p50_ms"), ring.get("handoff_p50_ms") if ring else None)
        return [
            _num(row.get("owner_changes_per_s")),
            _ms(row.get("handoff_p50_ms")),
            "-" if vs is None else f"{vs:.2f}",
            _ms(row.get("handoff_p99_ms")),
            _ms(row.get("wait_p99_ms")),
            _num(row.get("round_trips_per_op"), 2),
        ]

    out += _table(header, _rows_for(rows, impls, "handoff", handoff, len(header)))

    out += redisson_markdown(result)

    out += ["", "## 4. Read-write lock: 8 readers + 1 writer on one lock", ""]
    header = ["implementation", "mode", "tasks", "reads/s", "writes/s", "read wait p50 / p99 ms",
              "write wait p50 / p99 / max ms", "round trips/acq", "notes"]  # fmt: skip

    def rw(row: Row) -> list[str]:
        return [
            _num(row.get("read_acq_per_s")),
            _num(row.get("write_acq_per_s")),
            " / ".join(_ms(row.get(k)) for k in ("read_wait_p50_ms", "read_wait_p99_ms")),
            " / ".join(
                _ms(row.get(k))
                for k in ("write_wait_p50_ms", "write_wait_p99_ms", "write_wait_max_ms")
            ),
            _num(row.get("round_trips_per_op"), 2),
        ]

    out += _table(header, _rows_for(rows, impls, "rw", rw, len(header)))

    out += ["", "## 5. Scale (aiolock)", ""]
    wd = result.get("watchdog")
    if wd:
        out += _kv_table(
            "watchdog: locks held under the watchdog (watchdog_timeout=3 s, period 1 s)", wd
        )
    wt: Sequence[Mapping[str, Any]] = result.get("waiters") or []
    if wt:
        keys: list[str] = []
        for variant in wt:
            keys.extend(k for k in variant if k not in keys and k != "client")
        lines = [
            [k, *(_fmt_ratio(v.get(k)) if v.get(k) is not None else "-" for v in wt)] for k in keys
        ]
        out += ["**waiters: tasks waiting on locks, memory while parked, then drained**", ""]
        out += [*_table(["metric", *(str(v.get("client")) for v in wt)], lines), ""]

    out += ["", "## Targets", ""]
    out += [
        "Each ratio is taken per repetition, between implementations measured in the same "
        "round, then summarised (median, min-max over the repetitions).",
        "",
    ]
    out += _targets_md(result.get("targets", []))
    out += ["", "Further figures (from the medians):", ""]
    out += [f"- {k}: {_fmt_ratio(v)}" for k, v in result.get("ratios", {}).items()]
    out += ["", "See benchmarks/README.md for what each number means.", ""]
    return "\n".join(out)


#: The headline rows: (label, case, variant, metric, unit, the baseline the ratio is over).
_HEADLINE = (
    ("1 task, uncontended lock+unlock", "uncontended", "1 task", "pairs_per_s", "pairs/s",
     "floor-2xevalsha"),
    ("32 tasks, uncontended", "uncontended", "32 tasks", "pairs_per_s", "pairs/s",
     "floor-2xevalsha"),
    ("16 tasks on one lock", "contended", "N=16", "owner_changes_per_s", "owner changes/s",
     "ring"),
    ("4 processes x 8 tasks on one lock", "contended", "4x8", "owner_changes_per_s",
     "owner changes/s", "ring"),
)  # fmt: skip
#: Not the best Python peer: aiolock's own objects, the baselines that are not locks, and
#: Redisson (Java), which has a column of its own.
_NOT_PEERS = ("aiolock", "floor", "ring", "redisson")


def headline(result: Mapping[str, Any]) -> str:
    """The headline table: aiolock's Lock against the floor (or the ring) and the best peer
    that ran, from the medians of this run; empty when the run measured none of its rows."""
    rows: Sequence[Row] = result["summary"]
    impls: Mapping[str, Mapping[str, str]] = result["impls"]

    def ok(row: Row | None, metric: str) -> float | None:
        value = None if row is None or row.get("status") != "ok" else row.get(metric)
        return float(value) if isinstance(value, int | float) else None

    def times(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    lines = []
    java_cells: list[str] = []
    for label, case, variant, metric, unit, base in _HEADLINE:
        mine = ok(_find(rows, case, variant, "aiolock"), metric)
        if mine is None:
            continue
        floor = ok(_find(rows, case, variant, base), metric)
        peers = [
            (value, impls[row["impl"]]["label"])
            for row in rows
            if (row["case"], row["variant"]) == (case, variant)
            and not row["impl"].startswith(_NOT_PEERS)
            and (value := ok(row, metric)) is not None
        ]
        best = max(peers, default=None)
        java = ok(_find(rows, case, variant, "redisson"), metric)
        java_cells.append("-" if java is None else f"{times(_ratio(mine, java))} ({_num(java)}/s)")
        lines.append(
            [
                label,
                f"{mine:,.0f} {unit}",
                f"{times(_ratio(mine, floor))} the {'ring' if base == 'ring' else 'floor'}"
                f" ({_num(floor)}/s)",
                "-" if best is None else f"{best[1]}: {best[0]:,.0f}/s",
                "-" if best is None else times(_ratio(mine, best[0])),
            ]
        )
    if not lines:
        return ""
    meta = result["meta"]
    header = ["case", "aiolock Lock", "against the floor / ring", "best peer", "÷ best peer"]
    java = any(cell != "-" for cell in java_cells)
    if java:  # Redisson (Java) measured: aiolock ÷ Redisson (Redisson's figure)
        header.append("÷ Redisson (Java)")
        lines = [[*line, cell] for line, cell in zip(lines, java_cells, strict=True)]
    load = [f"{x:.1f}" for x in meta.get("load_average") or () if isinstance(x, int | float)]
    cores = (meta.get("environment") or {}).get("cpu_count")
    host = (
        f" Host load average {' at the start, '.join(load)} at the end, on {cores} cores."
        if len(load) == 2 and cores
        else ""
    )
    return "\n".join(
        [
            f"## Headline ({meta['mode']} run: {meta['duration_s']} s x {meta['reps']} "
            "repetition(s), medians)",
            "",
            *_table(header, lines),
            "",
            "floor: two bare EVALSHA round trips (not a lock); ring: a pub/sub token ring "
            "(not a lock); peers: the other Python locks that could run here"
            + ("; Redisson: the Java client's RLock, threads in JVMs." if java else ".")
            + host,
            *(
                []
                if meta["mode"] == "full"
                else [
                    "A quick run: one short round each, so a ratio moves by 10-30 % from run "
                    "to run on a shared machine. `nox -s bench -- --full` (pinned: `--pin`) "
                    "for figures to compare.",
                ]
            ),
            "",
        ]
    )


#: The cases Redisson is measured in (issue 38) and the project's goal for aiolock ÷ Redisson
#: in each (0: reported, no goal): (label, case, variant, metric, goal).
REDISSON_CASES = (
    ("1 thread, uncontended", "uncontended", "1 task", "pairs_per_s", 0.8),
    ("32 threads, uncontended", "uncontended", "32 tasks", "pairs_per_s", 0.0),
    ("16 threads on one lock", "contended", "N=16", "owner_changes_per_s", 1.0),
    ("4 processes x 8 on one lock", "contended", "4x8", "owner_changes_per_s", 1.0),
)
#: aiolock's side: the async Lock (tasks) and the sync client (threads, as Redisson's).
_AIOLOCK_SIDES = ("aiolock", "aiolock-sync")


def redisson_ratios(runs: Sequence[Row]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{case label: {aiolock key: spread of the per-repetition ratio}}`` of aiolock's
    figure over Redisson's in the same repetition (empty where Redisson has none)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for label, case, variant, metric, _ in REDISSON_CASES:
        theirs = _per_rep(runs, case, variant, "redisson", metric)
        if not theirs:
            continue
        out[label] = {}
        for side in _AIOLOCK_SIDES:
            mine = _per_rep(runs, case, variant, side, metric)
            values = [mine[r] / theirs[r] for r in mine if theirs.get(r)]
            if values:
                out[label][side] = _spread(values)
    return out


def redisson_markdown(result: Mapping[str, Any]) -> list[str]:
    """The Redisson section: aiolock against Redisson (Java) case by case, with each side's
    server commands and round trips per acquisition; one line where Redisson could not run,
    nothing where it was not selected."""
    impls: Mapping[str, Mapping[str, str]] = result["impls"]
    if "redisson" not in impls:
        return []
    out = ["", "## Redisson (Java) as a peer", ""]
    status = impls["redisson"].get("status")
    if status:
        return [*out, f"Redisson (Java): not measured here: {status}", ""]
    rows: Sequence[Row] = result["summary"]
    per_rep = redisson_ratios(result.get("runs", []))

    def spread(value: Mapping[str, Any] | None) -> str:
        if not value or value.get("median") is None:
            return "-"
        text = f"{value['median']:.2f}"
        return text if value["reps"] < 2 else f"{text} ({value['min']:.2f}-{value['max']:.2f})"

    def pair(case: str, variant: str, metric: str, digits: int) -> str:
        cells = []
        for impl in ("aiolock", "redisson"):
            row = _find(rows, case, variant, impl)
            ok = row is not None and row.get("status") == "ok"
            cells.append(_num(row.get(metric), digits) if ok and row else "-")
        return " / ".join(cells)

    def ms_pair(case: str, variant: str) -> str:
        if case != "contended":
            return "-"
        cells = []
        for impl in ("aiolock", "redisson"):
            row = _find(rows, case, variant, impl) or {}
            cells.append("/".join(_ms(row.get(k)) for k in ("handoff_p50_ms", "handoff_p99_ms")))
        return " against ".join(cells)

    header = ["case", "aiolock Lock", "Redisson", "aiolock ÷ Redisson", "goal",
              "aiolock.sync ÷ Redisson", "server cmds/acq (aiolock / Redisson)",
              "round trips/acq (aiolock / Redisson)", "client CPU µs/acq (aiolock / Redisson)",
              "hand-off p50/p99 ms (aiolock against Redisson)"]  # fmt: skip
    lines = []
    for label, case, variant, metric, goal in REDISSON_CASES:
        theirs = _find(rows, case, variant, "redisson")
        if theirs is None:
            continue
        unit = "pairs/s" if metric == "pairs_per_s" else "owner changes/s"
        ratio = per_rep.get(label, {})
        met = ""
        if goal and (median := (ratio.get("aiolock") or {}).get("median")) is not None:
            met = " met" if median >= goal else " **missed**"
        lines.append(
            [
                label,
                f"{pair(case, variant, metric, 0).split(' / ')[0]} {unit}",
                str(theirs.get("status"))
                if theirs.get("status") != "ok"
                else f"{_num(theirs.get(metric))} {unit}",
                spread(ratio.get("aiolock")),
                (f">= {goal:g}" if goal else "(reported)") + met,
                spread(ratio.get("aiolock-sync")),
                pair(case, variant, "server_cmds_per_op", 2),
                pair(case, variant, "round_trips_per_op", 2),
                pair(case, variant, "client_cpu_us_per_op", 0),
                ms_pair(case, variant),
            ]
        )
    out += [
        f"{impls['redisson'].get('note', '')}. Measured in the same rounds as the Python "
        "peers; a ratio is taken per repetition between figures of the same round (median, "
        "min-max). Redisson's round trips are the requests its connections wrote (a batch "
        "counts once), its server commands the same INFO commandstats deltas as the others'; "
        "its client CPU is the JVMs' whole process CPU in the window (Netty's and Redisson's "
        "threads, the JIT, the GC).",
        "",
        *_table(header, lines),
        "",
    ]
    return out


def _pinned(pinned: Mapping[str, Any] | None) -> str:
    if not pinned:
        return "no (server and clients on any CPU)"
    return f"server and every benchmark process on CPU {pinned['cpu']}"


def _pct(value: Any) -> str:
    return "n/a" if not isinstance(value, int | float) else f"{value:.1f} %"


def _steal_range(result: Mapping[str, Any]) -> str:
    seen = [r["steal_pct"] for r in result.get("runs", []) if isinstance(r.get("steal_pct"), float)]
    if not seen:
        return "n/a"
    return f"{min(seen):.1f}-{max(seen):.1f} %, median {statistics.median(seen):.1f} %"


def _baseline(baseline: Mapping[str, Any] | None) -> str:
    if not baseline:
        return "none (--baseline REF measures an earlier aiolock beside this one)"
    return f"aiolock at {baseline['ref']} ({baseline['commit']}), as `aiolock-baseline`"


def _fmt_ratio(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "n/a (not measured)" if value is None else str(value)


def _kv_table(title: str, data: Mapping[str, Any]) -> list[str]:
    lines = [[k, _fmt_ratio(v) if isinstance(v, float) else str(v)] for k, v in data.items()]
    return [f"**{title}**", "", *_table(["metric", "value"], lines), ""]


def _per_rep(
    runs: Sequence[Row], case: str, variant: str, impl: str, metric: str
) -> dict[int, float]:
    """``metric`` of one implementation in one scenario, by repetition (ok runs only)."""
    out: dict[int, float] = {}
    for run in runs:
        if (run["case"], run["variant"], run["impl"]) != (case, variant, impl):
            continue
        value = run.get(metric)
        if run.get("status") == "ok" and isinstance(value, int | float):
            out[int(run["rep"])] = float(value)
    return out


def _spread(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"median": None, "min": None, "max": None, "reps": 0}
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "reps": len(values),
    }


# The issue's targets: (name, case, variant, metric, impl, over impl or None, at least?, bound).
# A bound of 0 is a figure reported, not a target: the ratios to ``--baseline`` compare with
# whatever ref is given (the first round's <= 0.5 was against the code before that round).
_TARGETS: tuple[tuple[str, str, str, str, str, str | None, bool, float], ...] = (
    ("uncontended pairs/s ÷ 2xEVALSHA floor, 1 task", "uncontended", "1 task",
     "pairs_per_s", "aiolock", "floor-2xevalsha", True, 1.3),
    ("uncontended pairs/s ÷ 2xEVALSHA floor, 32 tasks", "uncontended", "32 tasks",
     "pairs_per_s", "aiolock", "floor-2xevalsha", True, 3.0),
    ("N=16 owner changes/s ÷ token ring", "contended", "N=16",
     "owner_changes_per_s", "aiolock", "ring", True, 1.1),
    ("N=16 fewest acquisitions of one task (0: starved)", "contended", "N=16",
     "per_task_min", "aiolock", None, True, 1.0),
    ("4x8 (4 processes) round trips per acquisition", "contended", "4x8",
     "round_trips_per_op", "aiolock", None, False, 3.0),
    ("4x8 (4 processes) owner changes/s ÷ token ring", "contended", "4x8",
     "owner_changes_per_s", "aiolock", "ring", True, 1.0),
    ("client CPU per uncontended pair ÷ baseline, 1 task", "uncontended", "1 task",
     "client_cpu_us_per_op", "aiolock", "aiolock-baseline", False, 0.0),
    ("client CPU per uncontended pair ÷ baseline, 32 tasks", "uncontended", "32 tasks",
     "client_cpu_us_per_op", "aiolock", "aiolock-baseline", False, 0.0),
    ("uncontended pairs/s ÷ baseline, 1 task", "uncontended", "1 task",
     "pairs_per_s", "aiolock", "aiolock-baseline", True, 0.0),
    ("uncontended pairs/s ÷ baseline, 32 tasks", "uncontended", "32 tasks",
     "pairs_per_s", "aiolock", "aiolock-baseline", True, 0.0),
    ("sync: uncontended pairs/s ÷ python-redis-lock, 1 thread", "uncontended", "1 task",
     "pairs_per_s", "aiolock-sync", "python-redis-lock", True, 1.0),
    ("sync: N=16 acquisitions/s ÷ python-redis-lock, 16 threads", "contended", "N=16",
     "acq_per_s", "aiolock-sync", "python-redis-lock", True, 1.0),
    ("sync: 4x8 acquisitions/s ÷ python-redis-lock, 4 processes x 8 threads", "contended",
     "4x8", "acq_per_s", "aiolock-sync", "python-redis-lock", True, 1.0),
    ("sync: uncontended pairs/s ÷ redis-py Lock, 1 thread", "uncontended", "1 task",
     "pairs_per_s", "aiolock-sync", "redis-py-sync", True, 0.0),
    ("sync: N=16 acquisitions/s ÷ redis-py Lock, 16 threads", "contended", "N=16",
     "acq_per_s", "aiolock-sync", "redis-py-sync", True, 0.0),
    ("Redisson: uncontended pairs/s ÷ Redisson (Java), 1 task against 1 thread",
     "uncontended", "1 task", "pairs_per_s", "aiolock", "redisson", True, 0.8),
    ("Redisson: uncontended pairs/s ÷ Redisson (Java), 32 tasks against 32 threads",
     "uncontended", "32 tasks", "pairs_per_s", "aiolock", "redisson", True, 0.0),
    ("Redisson: N=16 owner changes/s ÷ Redisson (Java), 16 threads", "contended", "N=16",
     "owner_changes_per_s", "aiolock", "redisson", True, 1.0),
    ("Redisson: 4x8 owner changes/s ÷ Redisson (Java), 4 JVMs x 8 threads", "contended",
     "4x8", "owner_changes_per_s", "aiolock", "redisson", True, 1.0),
)  # fmt: skip


def targets(runs: Sequence[Row]) -> list[dict[str, Any]]:
    """Each target: the value per repetition (a ratio of two implementations measured in the
    same repetition), its median, min and max, and whether the median meets the bound."""
    out: list[dict[str, Any]] = []
    for name, case, variant, metric, impl, over, at_least, bound in _TARGETS:
        mine = _per_rep(runs, case, variant, impl, metric)
        if over is None:
            values = list(mine.values())
        else:
            theirs = _per_rep(runs, case, variant, over, metric)
            values = [mine[r] / theirs[r] for r in mine if theirs.get(r)]
        spread = _spread(values)
        median = spread["median"]
        met = None if median is None else (median >= bound if at_least else median <= bound)
        target = f"{'>=' if at_least else '<='} {bound:g}" if bound else "(reported)"
        out.append({"target": name, "bound": target, **spread, "met": met if bound else None})
    return out


def ratios(rows: Sequence[Row], result: Mapping[str, Any]) -> dict[str, Any]:
    """Further figures for aiolock's Lock (``None`` where not measured), from the medians."""

    def get(case: str, variant: str, impl: str, metric: str) -> Value:
        row = _find(rows, case, variant, impl)
        return None if row is None or row.get("status") != "ok" else row.get(metric)

    out: dict[str, Any] = {}
    for v in ("N=2", "N=16"):
        out[f"handoff p50 ÷ ring p50 ({v})"] = _ratio(
            get("handoff", v, "aiolock", "handoff_p50_ms"),
            get("handoff", v, "ring", "handoff_p50_ms"),
        )
        out[f"handoff p99 ms ({v})"] = get("handoff", v, "aiolock", "handoff_p99_ms")
    out["round trips per contended acquisition (N=16)"] = get(
        "contended", "N=16", "aiolock", "round_trips_per_op"
    )
    out["server commands per contended acquisition (N=16)"] = get(
        "contended", "N=16", "aiolock", "server_cmds_per_op"
    )
    wd = result.get("watchdog") or {}
    out["watchdog renewal calls (evalsha) per period, 10,000 locks"] = wd.get(
        "renewal_evalsha_per_period"
    )
    return out


def _targets_md(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    def fmt(value: Any) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = [
        [
            row["target"],
            row["bound"],
            fmt(row["median"]),
            f"{fmt(row['min'])}-{fmt(row['max'])}",
            str(row["reps"]),
            {True: "met", False: "**missed**", None: "-"}[row["met"]],
        ]
        for row in rows
        if row["reps"]
    ]
    header = ["target", "bound", "median", "min-max", "reps", ""]
    return _table(header, lines) if lines else ["(no target measured in this run)"]


def write(out_dir: Path, result: Mapping[str, Any], md: str) -> list[Path]:
    """Write results.json and results.md; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "results.json"
    md_path = out_dir / "results.md"
    json_path.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    md_path.write_text(md, encoding="utf-8")
    return [json_path, md_path]
