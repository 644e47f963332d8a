"""FastAPI (and Starlette) integration: one client per app, and a lock held per request.

```python
from aiolock.integrations.fastapi import lifespan, get_client, hold

app = FastAPI(lifespan=lifespan("redis://...", watchdog_timeout=10))

@app.post("/orders/{order_id}/pay", dependencies=[Depends(hold("orders:{order_id}", wait=2))])
async def pay(order_id: int, client: Client = Depends(get_client)) -> dict[str, str]: ...
```

``hold(...)`` answers 423 (with ``Retry-After``) when the wait runs out, 503 when Redis
cannot be reached or the hold is lost while the handler runs (the handler is cancelled), and
stops waiting when the client disconnects (the handler never runs; 499 in the access log).
The lock is held until the response has been sent (FastAPI's default dependency scope);
``Depends(hold(...), scope="function")`` releases it when the handler returns.

A handler that completed gets its own response: a release that then fails (Redis
unreachable) or finds the lock lost is logged once at WARNING, one line, never a 500 or 503
after the work was done.

Needs the ``aiolock[fastapi]`` extra. Importing ``aiolock`` never imports this module.
"""

# No ``from __future__ import annotations``: FastAPI reads the dependency's annotations
# (``request: Request``) at runtime.

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeVar, Unpack

from fastapi import HTTPException, Request
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect

from .._client import Client
from .._config import UrlOptions, check_url_options
from .._engine.guard import Hold
from ._common import CLIENT_CLOSED_REQUEST, LockKind, Refused, Route, held

__all__ = ("STATE_KEY", "get_client", "hold", "lifespan")

AppT = TypeVar("AppT", bound=Starlette)

#: Where the app's client lives: the lifespan state (``request.state.aiolock_client``) and
#: ``app.state.aiolock_client`` of the app whose lifespan made it.
STATE_KEY = "aiolock_client"

AppLifespan = Callable[[AppT], contextlib.AbstractAsyncContextManager[Mapping[str, Any] | None]]


def lifespan(
    url: str, *, app_lifespan: AppLifespan[AppT] | None = None, **options: Unpack[UrlOptions]
) -> Callable[[AppT], contextlib.AbstractAsyncContextManager[dict[str, Any]]]:
    """A lifespan that gives the app one client for ``url`` and closes it at shutdown.

    ``options`` are ``aiolock.Client.from_url``'s. ``app_lifespan``: the app's own lifespan,
    run inside this one (the client is open while it runs; a state it yields is merged).
    """
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, not {type(url).__name__}")
    check_url_options(options)  # here, not at the app's startup

    @contextlib.asynccontextmanager
    async def run(app: AppT) -> AsyncIterator[dict[str, Any]]:
        client = Client.from_url(url, **options)
        try:
            app.state.aiolock_client = client
            state: dict[str, Any] = {STATE_KEY: client}
            if app_lifespan is None:
                yield state
            else:
                async with app_lifespan(app) as own:
                    yield {**(own or {}), **state}
        finally:
            await client.aclose()

    return run


def get_client(request: Request) -> Client:
    """The app's client (a dependency: ``client: Client = Depends(get_client)``)."""
    for state in (request.state, request.app.state):
        client = getattr(state, STATE_KEY, None)
        if isinstance(client, Client):
            return client
    raise RuntimeError(
        "no aiolock client for this app: create it with "
        "FastAPI(lifespan=aiolock.integrations.fastapi.lifespan(url)) "
        "and run its lifespan"
    )


def hold(
    template: str,
    *,
    wait: float | None = None,
    lease: float | None = None,
    kind: LockKind = "lock",
    retry_after: int = 1,
) -> Callable[[Request], AsyncIterator[Hold]]:
    """A dependency that holds the lock ``template`` (formatted from path parameters).

    The lock is ``guarded()``: the handler is cancelled if it is lost (503). ``wait`` as
    in ``acquired()`` (None: no limit); when it runs out: 423 with ``Retry-After:
    retry_after``. Redis unreachable: 503. The request's body is read before the wait
    (FastAPI reads it anyway for body parameters) so that the client's disconnect can be
    seen while the request waits.
    """
    route = Route("hold", template, wait=wait, lease=lease, kind=kind, retry_after=retry_after)

    async def dependency(request: Request) -> AsyncIterator[Hold]:
        handle = route.handle(get_client(request), request.path_params)
        try:
            # Cached on the request for the handler; the receive channel then carries
            # nothing but the disconnect.
            await request.body()
        except ClientDisconnect:
            raise HTTPException(CLIENT_CLOSED_REQUEST, "the client closed the request") from None

        async def disconnected() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        try:
            async with held(route, handle, disconnected) as lock_hold:
                yield lock_hold
        except Refused as refused:
            raise HTTPException(refused.status, refused.detail, refused.headers) from refused

    return dependency
