"""Errors about a semaphore call it a semaphore, not a lock (issue 37)."""

from __future__ import annotations

import pytest

import aiolock

from .conftest import ClientFactory
from .faultproxy import FaultProxy, script


async def test_an_unknown_permit_id_names_the_semaphore(
    make_client: ClientFactory, name: str
) -> None:
    psem = make_client().permit_expirable_semaphore(name, permits=1)
    with pytest.raises(aiolock.LockNotOwnedError, match=rf"^semaphore '{name}' is not held"):
        await psem.release("0" * 32)


async def test_a_failed_release_at_the_end_of_a_block_names_the_semaphore(
    proxy: FaultProxy, name: str
) -> None:
    client = aiolock.Client.from_url(proxy.url, retry_attempts=0)
    try:
        sem = client.semaphore(name, permits=1)
        with (
            proxy.refuse(script("semaphore_add"), "ERR refused by the test"),
            pytest.raises(aiolock.ReleaseError, match=rf"^semaphore '{name}': "),
        ):
            async with sem.acquired():
                pass
        await sem.delete()
    finally:
        await client.aclose()
