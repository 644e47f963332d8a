"""A Flask (or Django) payment route under an aiolock.sync fenced lock.

Two replicas of a web app take payments for orders; a payment must not run twice at once
for one order, and the ledger rejects a write from a holder whose lock has since passed to
another (its fencing token is older). The route's body is :func:`pay`, a plain function of
the blocking API (``aiolock.sync``): the example runs without Flask; :func:`create_app`
wires it into Flask when Flask is installed (``pip install flask``)::

    REDIS_URL=redis://localhost:6379/0 flask --app 'examples.sync_flask:create_app()' run

The same body in a Django view (``views.py``)::

    from django.http import JsonResponse
    from examples.sync_flask import Ledger, pay

    client = aiolock.sync.Client.from_url(settings.REDIS_URL)  # one per process
    ledger = Ledger()

    def pay_view(request, order_id):
        amount = json.loads(request.body)["amount"]
        return JsonResponse(pay(client, ledger, order_id, amount))

One sync client per process, made at import (Flask, Django) or, in a server that forks
its workers after import (gunicorn with ``--preload``), in each worker (``post_fork``): a
client used before a fork refuses in the child. Threads of one client exclude each other
as processes do: each request thread is its own holder.
"""

from __future__ import annotations

import atexit
import importlib
import os
import threading
from typing import Any

import aiolock
import aiolock.sync


class Ledger:
    """The payments store: it refuses a write whose fencing token is older than the last."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self.payments: dict[int, list[tuple[int, int]]] = {}
        self._last_token: dict[int, int] = {}

    def record(self, order_id: int, amount: int, token: int) -> int:
        """Append a payment made under fencing ``token``; how many the order has now."""
        with self._guard:
            if token < self._last_token.get(order_id, 0):
                raise RuntimeError(f"stale fencing token {token} for order {order_id}")
            self._last_token[order_id] = token
            rows = self.payments.setdefault(order_id, [])
            rows.append((token, amount))
            return len(rows)


def pay(client: aiolock.sync.Client, ledger: Ledger, order_id: int, amount: int) -> dict[str, int]:
    """Take a payment for ``order_id``, one at a time per order across every replica.

    Waits up to 10 s for another payment of the order to finish (``LockTimeoutError``
    after that: answer 409/503). The hold is guarded: if the lock were lost mid-way (a
    Redis outage longer than the lease), ``hold.check()`` stops the work before the
    ledger write and the block raises ``LockLostError``.
    """
    lock = client.fenced_lock(f"orders:{order_id}")
    with lock.guarded(wait=10) as hold:
        token = hold.token
        assert token is not None  # a fenced lock's hold always has one
        # ... charge the card here ...
        hold.check()
        count = ledger.record(order_id, amount, token)
    return {"order": order_id, "payments": count, "fencing_token": token}


def create_app(redis_url: str | None = None, *, key_prefix: str = "") -> Any:
    """The Flask app (Flask is this example's optional dependency, not aiolock's)."""
    flask: Any = importlib.import_module("flask")
    client = aiolock.sync.Client.from_url(
        redis_url or os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
        key_prefix=key_prefix,
    )
    atexit.register(client.close)
    ledger = Ledger()
    app = flask.Flask(__name__)

    def pay_route(order_id: int) -> Any:
        amount = int(flask.request.get_json()["amount"])
        try:
            return pay(client, ledger, order_id, amount)
        except aiolock.LockTimeoutError:
            return {"error": "another payment of this order is under way"}, 409

    # app.post(...) as a decorator would do; this form keeps the view typed without Flask.
    app.add_url_rule("/orders/<int:order_id>/pay", view_func=pay_route, methods=["POST"])
    return app
