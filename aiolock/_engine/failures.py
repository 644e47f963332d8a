"""What a failed call to the server tells: one classification for every path.

A call's exception says whether its command may have run, and that alone decides what the
caller owes the server: an acquire that may have taken a hold is undone in the background,
a release or a change that may not have landed is finished in the background, and one that
surely did not run needs nothing. Attempts, releases, the counting objects and the
background resends all ask ``failure(exc)`` rather than combining predicates each its own
way.
"""

from __future__ import annotations

import asyncio
import enum

from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._net.scripts import refused

__all__ = ("Failure", "failure")


class Failure(enum.Enum):
    """The kinds of failed call, by what they tell of the command."""

    #: The login was refused (a ConnectionError to redis-py): nothing ran, and sending again
    #: cannot succeed.
    LOGIN_REFUSED = "login refused"
    #: The server refused to run it (TRYAGAIN, BUSY, LOADING, OOM, READONLY...), after the
    #: client's own retries: this send did not run, an earlier one that timed out may have.
    REFUSED = "refused"
    #: Answered with an error of the script (WRONGTYPE, ERR): it failed before it changed
    #: anything.
    FAILED = "failed"
    #: No answer: cancelled in flight, the connection lost, a timeout. It may have run.
    CUT_OFF = "cut off"
    #: Anything else: not the server's doing, raised as it is.
    OTHER = "other"

    @property
    def may_have_run(self) -> bool:
        """Whether the command may have run: what it did is to be finished or undone."""
        return self is Failure.REFUSED or self is Failure.CUT_OFF

    @property
    def ran_nothing(self) -> bool:
        """Whether the command surely changed nothing: its login refused, its script failed.

        An attempt that failed otherwise may have taken what it asked for: it is undone.
        """
        return self is Failure.LOGIN_REFUSED or self is Failure.FAILED

    @property
    def resend(self) -> bool:
        """Whether a resend of an idempotent call may yet get an answer (not a cancel)."""
        return self.may_have_run


def failure(exc: BaseException) -> Failure:
    """What ``exc``, raised by a call to the server, tells of its command."""
    # First: redis-py's AuthenticationError is a ConnectionError, and a refusal a ResponseError.
    if isinstance(exc, AuthenticationError):
        return Failure.LOGIN_REFUSED
    if refused(exc):
        return Failure.REFUSED
    if isinstance(exc, ResponseError):
        return Failure.FAILED
    if isinstance(exc, (asyncio.CancelledError, RedisConnectionError, RedisTimeoutError, OSError)):
        return Failure.CUT_OFF
    return Failure.OTHER
