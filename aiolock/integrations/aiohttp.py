"""aiohttp integration: one client per app, and a lock held per request.

```python
from aiolock.integrations.aiohttp import setup, client_key, locked

app = web.Application()
setup(app, "redis://...", watchdog_timeout=10)   # cleanup_ctx: opened at startup, closed at cleanup

@routes.post("/orders/{order_id}/pay")
@locked("orders:{order_id}", wait=2)           # the name from request.match_info
async def pay(request: web.Request) -> web.Response:
    client = request.app[client_key]
```

``locked`` answers 423 (with ``Retry-After``) when the wait runs out, 503 when Redis cannot
be reached or the hold is lost while the handler runs (the handler is cancelled), and stops
waiting when the client disconnects, whether or not the server cancels handlers on
disconnect (``handler_cancellation``: off by default in ``web.run_app``, on in aiohttp's
``TestServer``): with it the wait is cancelled; without it the request's connection is
looked at every 0.1 s while it waits. Either way the handler never runs.

A handler that completed gets its own response: a release that then fails (Redis
unreachable) or finds the lock lost is logged once at WARNING, one line, never a 500 or 503
after the work was done.

Needs the ``aiolock[aiohttp]`` extra. Importing ``aiolock`` never imports this module.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Unpack

from aiohttp import web

from .._client import Client
from .._config import UrlOptions, check_url_options
from ._common import POLL_INTERVAL, LockKind, Refused, Route, held

__all__ = ("Handler", "client_key", "locked", "setup")

#: The app's client: ``request.app[client_key]`` (``request.config_dict`` in a sub-app).
client_key = web.AppKey("aiolock_client", Client)

#: What ``locked`` decorates and returns: an aiohttp request handler.
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def setup(app: web.Application, url: str, **options: Unpack[UrlOptions]) -> None:
    """Give ``app`` one client for ``url`` (``app[client_key]``), closed at cleanup.

    ``options`` are ``aiolock.Client.from_url``'s. The client is made when the app starts
    (in its ``cleanup_ctx``), so each run of the app has its own.
    """
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, not {type(url).__name__}")
    check_url_options(options)  # here, not at the app's startup

    async def client_context(app: web.Application) -> AsyncIterator[None]:
        client = Client.from_url(url, **options)
        try:
            app[client_key] = client
            yield
        finally:
            await client.aclose()

    app.cleanup_ctx.append(client_context)


def locked(
    template: str,
    *,
    wait: float | None = None,
    lease: float | None = None,
    kind: LockKind = "lock",
    retry_after: int = 1,
) -> Callable[[Handler], Handler]:
    """Decorate a handler to run holding the lock ``template`` (formatted from match_info).

    The lock is ``guarded()``: the handler is cancelled if it is lost (503). ``wait`` as in
    ``acquired()`` (None: no limit); when it runs out: 423 with ``Retry-After:
    retry_after``. Redis unreachable: 503.
    """
    route = Route("locked", template, wait=wait, lease=lease, kind=kind, retry_after=retry_after)

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def locked_handler(request: web.Request) -> web.StreamResponse:
            handle = route.handle(_client_of(request), request.match_info)
            try:
                async with held(route, handle, functools.partial(_disconnected, request)):
                    return await handler(request)
            except Refused as refused:
                return web.json_response(
                    {"detail": refused.detail}, status=refused.status, headers=refused.headers
                )

        return locked_handler

    return decorate


def _client_of(request: web.Request) -> Client:
    client = request.config_dict.get(client_key)
    if client is None:
        raise RuntimeError(
            "no aiolock client for this app: call aiolock.integrations.aiohttp.setup(app, url) "
            "before the app starts"
        )
    return client


async def _disconnected(request: web.Request) -> None:
    """Return once the request's connection is gone.

    aiohttp has no event for it: a lost connection drops the request's transport.
    """
    while True:
        transport = request.transport
        if transport is None or transport.is_closing():
            return
        await asyncio.sleep(POLL_INTERVAL)
