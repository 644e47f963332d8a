"""A Celery task that builds a report once, whichever worker runs it, under aiolock.sync.

The task may be queued twice (a retry, a beat schedule on two hosts); the second run finds
the report's lock held and skips instead of building it again. The task's body is
:func:`build_report`, a plain function of the blocking API: the example runs without
Celery. The Celery wiring (``pip install celery``)::

    from celery import Celery
    from celery.signals import worker_process_init

    app = Celery("reports", broker="redis://localhost:6379/1")
    client: aiolock.sync.Client | None = None

    @worker_process_init.connect
    def connect(**_: object) -> None:
        # After the pool forks: a client used before a fork refuses in the child.
        global client
        client = aiolock.sync.Client.from_url("redis://localhost:6379/0")

    @app.task(soft_time_limit=600)
    def build_report_task(day: str) -> bool:
        assert client is not None
        return build_report(client, day, store)

With a client made at import (a ``threads`` or ``solo`` pool, which does not fork), the
decorator form runs each call under the lock its arguments name (``wait=0``: a second
run raises ``LockTimeoutError`` instead of waiting)::

    @app.task
    @client.locked("reports:{day}", wait=0)
    def build(day: str) -> None: ...

A soft time limit (``SoftTimeLimitExceeded``, raised in the task's thread) or a worker's
warm shutdown interrupts the task like any exception: the ``with`` block releases the lock
on the way out, and a call interrupted while it waits for the lock leaves nothing behind.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import aiolock
import aiolock.sync


def build_report(
    client: aiolock.sync.Client,
    day: str,
    store: dict[str, list[str]],
    *,
    sections: int = 3,
    on_section: Callable[[int], None] | None = None,
) -> bool:
    """Build the report of ``day`` into ``store`` unless another worker is building it.

    True if this call built it; False if the report's lock was held (another run of the
    task has it: nothing to do). The build checks its hold between sections: a lost hold
    (a Redis outage longer than the lease) stops it before it writes a section that
    another worker may be writing too.
    """
    lock = client.lock(f"reports:{day}")
    try:
        with lock.guarded(wait=0) as hold:
            built = []
            for section in range(sections):
                hold.check()
                built.append(f"{day} section {section}")
                if on_section is not None:
                    on_section(section)
            store[day] = built
            return True
    except aiolock.LockTimeoutError:
        return False


def main() -> None:
    """Build today's report once (run it twice at once: one builds, one skips)."""
    with aiolock.sync.Client.from_url(
        os.environ.get("REDIS_URL", "redis://localhost:6379/0")
    ) as client:
        store: dict[str, list[str]] = {}
        day = sys.argv[1] if len(sys.argv) > 1 else "today"
        print("built" if build_report(client, day, store) else "skipped: another run has it")


if __name__ == "__main__":
    main()
