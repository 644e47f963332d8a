"""``replica_acks``: each acquisition followed by WAIT on the server that took it.

On the test server, which has no replica, an acquisition can never be acknowledged: it is
given back and the caller told. Acknowledged acquisitions are tested on the cluster, where
each primary has a replica (the conformance suite runs there with ``replica_acks=1``, and
``test_cluster.py`` checks that the WAIT runs on the slot's own primary).
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

import aiolock

from .conftest import ClientFactory


@pytest.mark.parametrize("how", ["lock", "try_lock"])
async def test_unacknowledged_acquisition_is_given_back_and_reported(
    make_client: ClientFactory, raw: Redis, name: str, how: str
) -> None:
    """Fewer replicas than asked for: ReplicaAckError, and the hold does not stay."""
    plain = make_client()
    lock = make_client(replica_acks=1, replica_ack_timeout=0.05).lock(name)
    acquire = lock.lock() if how == "lock" else lock.try_lock(wait=1)
    with pytest.raises(aiolock.ReplicaAckError, match="0 of 1 replicas") as caught:
        await acquire
    assert (caught.value.acked, caught.value.wanted) == (0, 1)
    # Given back before the error was raised.
    assert not await raw.exists(name)
    assert await lock.hold_count() == 0
    # Nothing held by nobody's knowledge: another client takes it at once.
    assert await plain.lock(name).try_lock(wait=0)
    await plain.lock(name).unlock()


async def test_an_attempt_that_takes_nothing_is_no_error(
    make_client: ClientFactory, name: str
) -> None:
    """Only a hold taken needs its replicas: a lock held elsewhere is just not acquired."""
    holder = make_client().lock(name)
    await holder.lock()
    strict = make_client(replica_acks=1, replica_ack_timeout=0.05).lock(name)
    assert not await strict.try_lock(wait=0)
    await holder.unlock()
