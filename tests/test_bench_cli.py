"""``nox -s bench`` is quick by default and ends with the headline table.

What a newcomer runs first: the defaults of ``python -m benchmarks`` (the headline cases
only, one round, no cluster or synchronizers), ``--full`` for every case, the committed
results written only by full pinned runs, and the headline table read off a run's rows
(aiolock against the floor or the ring and the best peer). No server is started here.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from .reference import ROOT


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``benchmarks.__main__``, imported from the repository root (it is not installed)."""
    monkeypatch.syspath_prepend(str(ROOT))
    import benchmarks.__main__ as main  # noqa: PLC0415

    return main


def test_the_default_run_is_the_quick_headline_run(bench: ModuleType) -> None:
    args = bench._parse([])
    assert args.cases == {"uncontended", "contended", "handoff"}
    assert (args.reps, args.duration) == (1, 0.3)
    assert args.no_cluster
    assert args.no_synchronizers
    # The floor, the ring and every peer are in it; aiolock's other locks are not.
    assert {"aiolock", "floor-2xevalsha", "ring", "redis-py", "pottery", "aioredlock"} <= set(
        args.impls
    )
    assert not {"aiolock-fair", "aiolock-rw-mixed", "aiolock-cluster"} & set(args.impls)


def test_full_runs_every_case(bench: ModuleType) -> None:
    args = bench._parse(["--full"])
    assert args.cases == set(bench.CASES)
    assert (args.reps, args.duration) == (4, 0.6)
    assert not args.no_cluster
    assert not args.no_synchronizers
    assert {"aiolock-fair", "aiolock-cluster"} <= set(args.impls)


@pytest.mark.parametrize("argv", [["--update-results"], ["--update-results", "--full"]])
def test_committed_results_come_from_full_pinned_runs_only(
    bench: ModuleType, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        bench._parse(argv)
    assert "--update-results needs --full --pin" in capsys.readouterr().err


def _row(case: str, variant: str, impl: str, **metrics: float) -> dict[str, Any]:
    return {"case": case, "variant": variant, "impl": impl, "status": "ok", **metrics}


@pytest.mark.usefixtures("bench")
def test_the_headline_compares_with_the_floor_the_ring_and_the_best_peer() -> None:
    from benchmarks._report import headline  # noqa: PLC0415  (after the fixture's path)

    rows = [
        _row("uncontended", "1 task", "aiolock", pairs_per_s=6000),
        _row("uncontended", "1 task", "floor-2xevalsha", pairs_per_s=4000),
        _row("uncontended", "1 task", "redis-py", pairs_per_s=3000),
        _row("uncontended", "1 task", "aiolock-fair", pairs_per_s=9000),  # not a peer
        _row("contended", "N=16", "aiolock", owner_changes_per_s=5000),
        _row("contended", "N=16", "ring", owner_changes_per_s=2500),
        _row("contended", "N=16", "python-redis-lock", owner_changes_per_s=1000),
        _row("contended", "N=16", "redis-py", owner_changes_per_s=40),
    ]
    labels = {
        "aiolock": "aiolock Lock",
        "aiolock-fair": "aiolock FairLock",
        "floor-2xevalsha": "floor",
        "ring": "ring",
        "redis-py": "redis-py Lock",
        "python-redis-lock": "python-redis-lock",
    }
    result = {
        "summary": rows,
        "impls": {key: {"label": label} for key, label in labels.items()},
        "meta": {
            "mode": "quick",
            "duration_s": 0.3,
            "reps": 1,
            "load_average": [1.0, 2.5],
            "environment": {"cpu_count": 2},
        },
    }
    lines = {line.split(" | ")[0].lstrip("| "): line for line in headline(result).splitlines()}
    one = lines["1 task, uncontended lock+unlock"]
    assert "1.50x the floor (4,000/s)" in one
    assert "redis-py Lock: 3,000/s" in one
    assert "| 2.00x |" in one
    sixteen = lines["16 tasks on one lock"]
    assert "2.00x the ring (2,500/s)" in sixteen
    assert "python-redis-lock: 1,000/s" in sixteen
    assert "| 5.00x |" in sixteen
    assert "32 tasks, uncontended" not in lines  # not measured: no row
    # A shared machine is named as such: the load says how far to trust a quick run.
    assert "Host load average 1.0 at the start, 2.5 at the end, on 2 cores." in headline(result)
    assert "A quick run" in headline(result)


@pytest.mark.usefixtures("bench")
def test_no_headline_without_its_cases() -> None:
    from benchmarks._report import headline  # noqa: PLC0415

    result = {"summary": [], "impls": {}, "meta": {"mode": "full", "duration_s": 0.6, "reps": 4}}
    assert headline(result) == ""


# --------------------------------------------------------------------------- Redisson: Java


def test_redisson_is_a_peer_of_the_quick_and_the_full_run_in_its_four_cases(
    bench: ModuleType,
) -> None:
    assert "redisson" in bench._parse([]).impls
    assert "redisson" in bench._parse(["--full"]).impls
    java = bench.ADAPTERS["redisson"]
    ran = {(s.case, s.variant) for s in bench.SCENARIOS if bench.applies(java, s)}
    assert ran == {
        ("uncontended", "1 task"),
        ("uncontended", "32 tasks"),
        ("contended", "N=16"),
        ("contended", "4x8"),
    }
    # The Python peers keep every scenario of their cases.
    assert bench.applies(bench.ADAPTERS["aiolock"], bench.SCENARIOS[2])  # N=2


def test_without_java_redisson_cannot_run_and_says_why(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from benchmarks import _redisson  # noqa: PLC0415

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no java, no mvn
    reason = _redisson.reason()
    assert reason is not None
    assert reason.startswith("cannot run: no java on PATH")
    monkeypatch.setattr(_redisson, "PROJECT", tmp_path / "nowhere")  # an sdist: no sources
    assert "no interop/redisson sources" in str(_redisson.reason())


def test_redisson_that_cannot_run_has_no_rows(bench: ModuleType) -> None:
    args = bench._parse(["--impl", "redisson"])
    impls = {"redisson": {"label": "Redisson", "mode": "thread", "note": "", "status": "no JDK"}}
    # No measurement is started (no server at this address): the rows are left out.
    assert bench._run_cases(args, "redis://127.0.0.1:1/0", impls, "x") == []


def _with_redisson(status: str | None = None) -> dict[str, Any]:
    rows = [
        _row("uncontended", "1 task", "aiolock", pairs_per_s=6000, round_trips_per_op=2.0),
        _row("uncontended", "1 task", "redisson", pairs_per_s=4000, round_trips_per_op=3.0),
        _row("contended", "N=16", "aiolock", owner_changes_per_s=3000, server_cmds_per_op=8.5),
        _row("contended", "N=16", "redisson", owner_changes_per_s=1000, server_cmds_per_op=18.0),
        _row("contended", "N=16", "ring", owner_changes_per_s=2500),
    ]
    if status:
        rows = [r for r in rows if r["impl"] != "redisson"]
    runs = [{**r, "rep": 0} for r in rows]
    labels = {"aiolock": "aiolock Lock", "redisson": "Redisson RLock (Java)", "ring": "ring"}
    impls = {k: {"label": v, "note": "", "status": None} for k, v in labels.items()}
    impls["redisson"]["status"] = status
    meta = {"mode": "quick", "duration_s": 0.3, "reps": 1}
    return {"summary": rows, "runs": runs, "impls": impls, "meta": meta}


@pytest.mark.usefixtures("bench")
def test_the_report_gives_aiolock_over_redisson_with_each_sides_costs() -> None:
    from benchmarks._report import headline, redisson_markdown  # noqa: PLC0415

    result = _with_redisson()
    lines = {line.split(" | ")[0].lstrip("| "): line for line in redisson_markdown(result)}
    one = lines["1 thread, uncontended"]
    assert "| 1.50 | >= 0.8 met |" in one
    assert "2.00 / 3.00" in one  # round trips per acquisition: aiolock / Redisson
    sixteen = lines["16 threads on one lock"]
    assert "| 3.00 | >= 1 met |" in sixteen
    assert "8.50 / 18.00" in sixteen  # server commands per acquisition
    assert "4 processes x 8 on one lock" not in lines  # not measured: no row
    head = headline(result)
    assert "÷ Redisson (Java)" in head
    assert "3.00x (1,000/s)" in head
    # Redisson is not the "best peer" (a Python one): it has its own column.
    assert "Redisson RLock (Java): 1,000/s" not in head


@pytest.mark.usefixtures("bench")
def test_without_redisson_the_report_says_why_in_one_line() -> None:
    from benchmarks._report import headline, redisson_markdown  # noqa: PLC0415

    result = _with_redisson("cannot run: no java on PATH")
    section = [line for line in redisson_markdown(result) if line and not line.startswith("#")]
    assert section == ["Redisson (Java): not measured here: cannot run: no java on PATH"]
    assert "Redisson" not in headline(result)
    del result["impls"]["redisson"]  # not selected (--impl): nothing at all
    assert redisson_markdown(result) == []
