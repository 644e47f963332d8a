"""The model-based tests (``test_model.py``) on a 3+3 cluster: the same state machines,
their clients going through the slot map, per-primary connections and sharded pub/sub.

As many examples as on one server: 25 by default, many more under ``--faults``.
"""

from __future__ import annotations

import time

import pytest
from hypothesis.stateful import run_state_machine_as_test

from .test_model import (
    RUNS,
    SHORT_LEASE,
    FairLockMachine,
    LockMachine,
    ReadWriteLockMachine,
    settings_for,
)
from .test_model import _Machine as Machine
from .topologies import ClusterHandle


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    "machine",
    [LockMachine, FairLockMachine, ReadWriteLockMachine],
    ids=["lock", "fair_lock", "read_write_lock"],
)
def test_model_on_cluster(
    machine: type[Machine],
    cluster: ClusterHandle,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    """The lock type behaves as the model says on a cluster too."""
    faults = bool(request.config.getoption("--faults"))
    RUNS.pop(machine.kind, None)
    start = time.monotonic()
    try:
        short_lease = SHORT_LEASE if faults else None
        bound = machine.bound(cluster.url, short_lease=short_lease, cluster=True)
        run_state_machine_as_test(bound, settings=settings_for(request))
    finally:
        took = time.monotonic() - start
        done = RUNS.get(machine.kind, {"examples": 0, "steps": 0})
        examples, steps = done["examples"], done["steps"] - done["examples"]
        with capsys.disabled():
            print(
                f"\n{machine.__name__} on a cluster: {examples} examples, "
                f"{steps} steps in {took:.1f} s"
            )
