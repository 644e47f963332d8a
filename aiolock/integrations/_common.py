"""What the web integrations share, free of any framework: the lock a request holds.

A request's hold is ``guarded()``: the handler is cancelled if the hold is lost. Waiting for
it races the client's disconnect, so a request whose client left stops waiting and its
handler never runs. Every way the wait can end without a hold becomes a `Refused`
with the HTTP status the framework module answers with:

- 423 Locked (with ``Retry-After``): the wait ran out, someone else holds the lock;
- 503 Service Unavailable: Redis could not be reached (redis-py's ``ConnectionError`` or
  ``TimeoutError`` after the client's retries) or the client is closing (the app is
  shutting down); too few replicas acknowledged the acquisition (``ReplicaAckError``, a
  client with ``replica_acks=``: the hold was given back, the handler never ran); also a
  hold lost while the handler ran (the handler was cancelled);
- 499 (nginx's "client closed request"): the client disconnected while the request waited.
  Nobody reads that answer; it names the outcome in access logs.

A handler that completed gets its own response, whatever happens at the release: a release
that fails (Redis unreachable) or finds the hold lost is logged once at WARNING (one line)
and is in the client's events and metrics, never turned into a 500 or 503 after the work
was done. 503 means the handler never ran or was cancelled.

``Retry-After`` defaults to 1 s: how long a holder keeps a lock is not known to the server
(a watchdog lease is renewed, so the lock's remaining lease says nothing about when it is
released), and asking Redis for a hint would add a query to a lock that is contended right
now. The request already waited ``wait``; a retry a second later costs one request. A route
whose holders are known to take longer says so with ``retry_after=``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._config import check_name, lease_seconds, wait_seconds
from .._exceptions import (
    ClientClosedError,
    LockLostError,
    LockTimeoutError,
    ReleaseError,
    ReplicaAckError,
)
from .._objects.decorator import LockKind, check_kind, lock_of_kind
from .._objects.decorator import _template_fields as template_fields

if TYPE_CHECKING:
    from .._client import Client
    from .._engine.guard import Hold
    from .._objects.handle import LockHandle

# LockKind: the kinds a route may hold, as ``client.locked(kind=...)`` takes them.
__all__ = ("LockKind", "Refused", "Route", "held")

log = logging.getLogger("aiolock")

#: How often the aiohttp integration looks whether a waiting request's client left (it has
#: no event for it when handlers are not cancelled on disconnect).
POLL_INTERVAL = 0.1

LOCKED = 423
UNAVAILABLE = 503
CLIENT_CLOSED_REQUEST = 499


class Refused(Exception):
    """The request gets no hold: answer with ``status`` (and ``Retry-After`` if given)."""

    def __init__(self, status: int, detail: str, retry_after: int | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = {} if retry_after is None else {"Retry-After": str(retry_after)}


class Route:
    """One route's lock: the name template, kind and times, all checked when it is made.

    ``what`` names the helper in messages (``hold`` or ``locked``).
    """

    __slots__ = ("fields", "kind", "lease", "retry_after", "template", "wait", "what")

    def __init__(
        self,
        what: str,
        template: object,
        *,
        wait: object,
        lease: object,
        kind: object,
        retry_after: object,
    ) -> None:
        self.what = what
        if not isinstance(template, str):
            raise TypeError(f"template must be a str, not {type(template).__name__}")
        if not template:
            raise ValueError("template must be a non-empty str")
        self.template = template
        self.fields = frozenset(template_fields(template))
        self.wait = wait_seconds(wait)
        self.lease = lease_seconds(lease)
        self.kind = check_kind(kind)
        if isinstance(retry_after, bool) or not isinstance(retry_after, int):
            raise TypeError(
                f"retry_after must be an int of seconds, not {type(retry_after).__name__}"
            )
        if retry_after < 0:
            raise ValueError(f"retry_after must be >= 0 seconds, got {retry_after}")
        self.retry_after = retry_after

    def name(self, params: Mapping[str, object]) -> str:
        """The lock name for a request whose path parameters are ``params``."""
        missing = self.fields - params.keys()
        if missing:
            raise LookupError(
                f"{self.what}({self.template!r}): the route has no path parameter "
                f"{', '.join(map(repr, sorted(missing)))} "
                f"(its path parameters: {', '.join(map(repr, params)) or 'none'})"
            )
        try:
            name = self.template.format_map(params)
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{self.what}({self.template!r}) could not be formatted from the path "
                f"parameters: {type(exc).__name__}: {exc}"
            ) from exc
        return check_name(name, f"lock name formatted from {self.template!r}")

    def handle(self, client: Client, params: Mapping[str, object]) -> LockHandle:
        """The handle of this route's lock for a request's path parameters."""
        return lock_of_kind(client, self.kind, self.name(params))


@contextlib.asynccontextmanager
async def held(
    route: Route, handle: LockHandle, disconnected: Callable[[], Awaitable[object]]
) -> AsyncIterator[Hold]:
    """Hold ``handle`` guarded for a request; `Refused` if the request gets no hold.

    ``disconnected()`` returns once the request's client has left; while the request waits
    it runs beside the wait, and ends the wait when it returns. The hold being lost while
    the request runs (its handler then cancelled) is a 503 too.
    """
    guarded = handle.guarded(wait=route.wait, lease=route.lease)
    hold = await _enter(route, guarded, disconnected)
    try:
        yield hold
    except BaseException as exc:
        # As ``async with`` does: the body's exception goes to the hold's exit.
        try:
            # A guarded block never suppresses the body's exception.
            await guarded.__aexit__(type(exc), exc, exc.__traceback__)
        except LockLostError as lost:
            raise Refused(UNAVAILABLE, f"the lock {handle.name!r} was lost") from lost
        raise
    else:
        try:
            await guarded.__aexit__(None, None, None)
        except (LockLostError, ReleaseError) as exc:
            # The handler completed: its work is done and its response is the answer. A
            # 503 now would tell a retrying client that nothing happened (it would pay
            # twice), and FastAPI may have sent the response already. The release's
            # problem is the operator's: one line, no traceback; the loss itself is in
            # the client's events (Lost) and metrics.
            log.warning(
                "aiolock: %s %r: the request's handler completed, but %s; "
                "the handler's response is sent",
                route.what,
                handle.name,
                _release_problem(exc),
            )


def _release_problem(exc: LockLostError | ReleaseError) -> str:
    """What went wrong at a completed request's release, in a few words."""
    if isinstance(exc, LockLostError):
        return f"the lock was lost before its release ({exc})"
    cause = exc.__cause__
    why = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
    return f"releasing the lock failed ({why}); it is released in the background or expires"


async def _enter(
    route: Route,
    guarded: contextlib.AbstractAsyncContextManager[Hold],
    disconnected: Callable[[], Awaitable[object]],
) -> Hold:
    """Enter ``guarded`` unless the client disconnects first; map the ways it fails."""
    # The disconnect ends the wait as a deadline would: through an asyncio.timeout scope
    # moved to "now", which cancels this task and turns that cancel (and only that one:
    # an outside cancel still raises CancelledError) into TimeoutError at its exit.
    try:
        async with asyncio.timeout(None) as scope:
            watcher = asyncio.create_task(_watch(disconnected, scope))
            try:
                return await guarded.__aenter__()
            finally:
                # Synchronous, before this task can yield: once the scope is left the
                # watcher can no longer move it.
                watcher.cancel()
    except LockTimeoutError as exc:
        raise Refused(
            LOCKED, f"the lock {exc.name!r} is held by someone else", route.retry_after
        ) from exc
    except (RedisConnectionError, RedisTimeoutError, ClientClosedError, ReplicaAckError) as exc:
        # ReplicaAckError: the hold was given back before the handler ran, as an outage's
        # refusal (a 500 would say the service broke, and hide that a retry may succeed).
        raise Refused(UNAVAILABLE, f"the lock service is unavailable: {exc}") from exc
    except TimeoutError:
        if scope.expired():
            raise Refused(CLIENT_CLOSED_REQUEST, "the client closed the request") from None
        raise


async def _watch(disconnected: Callable[[], Awaitable[object]], scope: asyncio.Timeout) -> None:
    """End the wait in ``scope`` once the request's client has disconnected."""
    try:
        await disconnected()
    except Exception:
        # Disconnects can no longer be seen for this request; its wait goes on as
        # it would without the watcher (bounded by ``wait``).
        log.exception("aiolock: watching a waiting request for its client's disconnect failed")
        return
    scope.reschedule(asyncio.get_running_loop().time())
