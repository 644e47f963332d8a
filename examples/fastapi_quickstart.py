"""The README's FastAPI snippet.

The lines between the markers are the README's, verbatim (tests/test_examples.py checks
it), and the suite runs and type-checks them, so the README's version always works.

Run it with ``REDIS_URL=redis://localhost:6379/0 uvicorn examples.fastapi_quickstart:app``.
"""

from __future__ import annotations

# --8<-- [start:readme]
import os

from fastapi import Depends, FastAPI

from aiolock.integrations.fastapi import hold, lifespan

# One client per app: opened at start-up, closed (handing its locks over) at shutdown.
app = FastAPI(lifespan=lifespan(os.environ.get("REDIS_URL", "redis://localhost:6379/0")))


# Runs only while this replica holds orders:{order_id}. Held elsewhere for 2 s more: 423 with
# Retry-After; Redis unreachable: 503; the lock lost meanwhile: the handler is cancelled, 503.
@app.post("/orders/{order_id}/pay", dependencies=[Depends(hold("orders:{order_id}", wait=2))])
async def pay(order_id: int) -> dict[str, int]:
    return {"paid": order_id}


# --8<-- [end:readme]
