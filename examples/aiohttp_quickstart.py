"""The README's aiohttp snippet.

The lines between the markers are the README's, verbatim (tests/test_examples.py checks
it), and the suite runs and type-checks them, so the README's version always works.

Run it with ``REDIS_URL=redis://localhost:6379/0 python -m examples.aiohttp_quickstart``.
"""

from __future__ import annotations

# --8<-- [start:readme]
import os

from aiohttp import web

from aiolock.integrations.aiohttp import locked, setup

routes = web.RouteTableDef()


@routes.post("/reports/{report}")
@locked("reports:{report}", wait=5)  # 423 with Retry-After after 5 s; 503 without Redis
async def build(request: web.Request) -> web.Response:
    return web.json_response({"built": request.match_info["report"]})


app = web.Application()
setup(app, os.environ.get("REDIS_URL", "redis://localhost:6379/0"))  # app[client_key]
app.add_routes(routes)
# --8<-- [end:readme]

if __name__ == "__main__":
    web.run_app(app)
