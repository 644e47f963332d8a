"""A FastAPI service whose payment endpoint holds a guarded lock per order.

Run it with ``REDIS_URL=redis://localhost:6379/0 uvicorn examples.fastapi_service:app``.

Each replica of the service pays an order only while it holds the lock ``orders:{order_id}``
(a fenced lock: every hold has a larger fencing token, to hand to the payment provider).
The hold is guarded: if it is lost (Redis cut off, the lock forced open), the handler is
cancelled and the request answers 503. A second payment of the same order waits up to 2 s,
then answers 423 with ``Retry-After``; a client that gives up while waiting is not charged.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

from fastapi import Depends, FastAPI
from pydantic import BaseModel

import aiolock
from aiolock.integrations.fastapi import get_client, hold, lifespan


class Payment(BaseModel):
    """What a client pays."""

    amount: int


def create_app(url: str, **options: Any) -> FastAPI:
    """The service on the Redis at ``url`` (``options``: ``aiolock.Client``'s)."""
    app = FastAPI(lifespan=lifespan(url, **options))
    #: What each order was paid, by fencing token (a real service writes it to its database,
    #: which refuses a token older than the last one it saw).
    ledger: dict[int, list[tuple[int, int]]] = {}
    app.state.ledger = ledger

    @app.post("/orders/{order_id}/pay")
    async def pay(
        order_id: int,
        payment: Payment,
        held: Annotated[
            aiolock.Hold, Depends(hold("orders:{order_id}", wait=2, kind="fenced_lock"))
        ],
    ) -> dict[str, int]:
        token = held.token
        assert token is not None  # a fenced lock's hold always has one
        ledger.setdefault(order_id, []).append((token, payment.amount))
        return {"order_id": order_id, "amount": payment.amount, "fencing_token": token}

    @app.get("/orders/{order_id}", dependencies=[Depends(hold("orders:{order_id}", wait=2))])
    async def order(
        order_id: int, client: Annotated[aiolock.Client, Depends(get_client)]
    ) -> dict[str, Any]:
        # The plain form: the lock held for the request, the client at hand for more.
        return {"order_id": order_id, "payments": len(ledger.get(order_id, [])), "by": client.id}

    return app


app = create_app(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
