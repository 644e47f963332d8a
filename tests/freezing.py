"""Freezing a server process: SIGSTOP, as a paused VM, a long fork or a stalled host.

Its connections stay open and accept bytes, but nothing is answered until SIGCONT; its keys'
leases run on the wall clock meanwhile, so a lease shorter than the freeze has ended when
it runs again. The "one node frozen while the others serve" tests use it on cluster nodes
(``topologies.Node``); ``aiolock.testing.LocalServer`` has ``pause()``/``resume()`` itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

__all__ = ("frozen",)


@contextlib.contextmanager
def frozen(pid: int | None) -> Iterator[None]:
    """The process ``pid`` (a child of this one) stopped for the body, then continued."""
    assert pid is not None, "the process is not running"
    os.kill(pid, signal.SIGSTOP)
    # Only once it is stopped: a command sent right after could still be answered.
    _, status = os.waitpid(pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), f"process {pid} exited instead of stopping ({status})"
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
