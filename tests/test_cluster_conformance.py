"""The conformance suite (``test_conformance.py``) again, every lock type on a 3+3 cluster.

The suite's tests are imported here; the fixtures below give them cluster clients instead
of single-server ones. Names are unique per test, so they spread over every primary.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import aiolock

from .clusters import assert_nothing_left
from .test_conformance import *  # noqa: F403 - the suite, collected here once more
from .test_conformance import ClientFactory
from .topologies import ClusterHandle


@pytest.fixture(params=[0, 1], ids=["", "replica_acks"])
async def make_client(
    cluster: ClusterHandle, uid: str, request: pytest.FixtureRequest
) -> AsyncIterator[ClientFactory]:
    """Cluster clients, without and with ``replica_acks=1`` (each primary has a replica):
    all closed, then nothing of the test may remain on any primary."""
    clients: list[aiolock.Client] = []

    def make(**options: Any) -> aiolock.Client:
        options.setdefault("replica_acks", request.param)
        client = aiolock.Client.from_url(cluster.url, cluster=True, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()
    await assert_nothing_left(cluster, uid)


@pytest.fixture
async def client(make_client: ClientFactory) -> aiolock.Client:
    return make_client()
