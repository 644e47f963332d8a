"""An aiohttp service whose report endpoint holds a guarded lock per report.

Run it with ``REDIS_URL=redis://localhost:6379/0 python -m examples.aiohttp_service``.

A report is built by one replica at a time: the handler runs holding ``reports:{report}``.
Another request for the same report waits up to 5 s, then answers 423 with ``Retry-After``;
Redis unreachable: 503; a client that disconnects while waiting stops waiting.
"""

from __future__ import annotations

import os
from typing import Any

from aiohttp import web

from aiolock.integrations.aiohttp import client_key, locked, setup

routes = web.RouteTableDef()
builds = web.AppKey("builds", dict[str, int])


@routes.post("/reports/{report}")
@locked("reports:{report}", wait=5)
async def build(request: web.Request) -> web.Response:
    """Build one report; the lock keeps every other replica out while it runs."""
    report = request.match_info["report"]
    counts = request.app[builds]
    counts[report] = counts.get(report, 0) + 1
    # The app's client is there for anything else the handler needs.
    client = request.app[client_key]
    return web.json_response({"report": report, "builds": counts[report], "by": client.id})


def create_app(url: str, **options: Any) -> web.Application:
    """The service on the Redis at ``url`` (``options``: ``aiolock.Client``'s)."""
    app = web.Application()
    setup(app, url, **options)
    app[builds] = {}
    app.add_routes(routes)
    return app


def main() -> None:
    """Serve on port 8080."""
    web.run_app(create_app(os.environ.get("REDIS_URL", "redis://localhost:6379/0")))


if __name__ == "__main__":
    main()
