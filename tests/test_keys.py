"""Key, channel and field names equal Redisson's for the same object (no server needed)."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from aiolock._keys import (
    fair_channel_base,
    fair_queue_key,
    fair_timeout_key,
    lock_channel,
    prefixed,
    rwlock_channel,
    rwlock_timeout_prefix,
    suffixed,
    unlock_latch_key,
    write_holder,
)

HOLDER = "1b9d6bcd-bbfd-4b2d-9b5d-ab8dfbbd4bed:7"
REQUEST = "0123456789abcdef0123456789abcdef"


def test_prefix_form_adds_braces() -> None:
    """The prefix form of a plain name is P:{name}."""
    assert prefixed("redisson_lock__channel", "orders") == "redisson_lock__channel:{orders}"
    assert prefixed("p", "a:b:c") == "p:{a:b:c}"


@pytest.mark.parametrize("name", ["{orders}", "{orders}:1", "a{b}c", "x}{y}", "{"])
def test_prefix_form_keeps_braced_name(name: str) -> None:
    """The prefix form of a name containing '{' anywhere is P:name, with no braces added."""
    assert prefixed("p", name) == f"p:{name}"


def test_suffix_form_adds_braces() -> None:
    """The suffix form of a plain name is {name}:S."""
    assert suffixed("orders", "s") == "{orders}:s"
    assert suffixed("a:b", "x:y") == "{a:b}:x:y"


@pytest.mark.parametrize("name", ["{orders}", "{orders}:1", "a{b}c"])
def test_suffix_form_keeps_braced_name(name: str) -> None:
    """The suffix form of a name containing '{' is name:S, with no braces added."""
    assert suffixed(name, "s") == f"{name}:s"


@pytest.mark.parametrize(
    ("name", "channel"),
    [
        ("orders", "redisson_lock__channel:{orders}"),
        ("svc:orders", "redisson_lock__channel:{svc:orders}"),
        ("{orders}:7", "redisson_lock__channel:{orders}:7"),
    ],
)
def test_lock_channel(name: str, channel: str) -> None:
    """The RLock channel is redisson_lock__channel:{name} (prefix form)."""
    assert lock_channel(name) == channel


@pytest.mark.parametrize(
    ("name", "latch"),
    [
        ("orders", f"redisson_unlock_latch:{{orders}}:{REQUEST}"),
        ("{orders}:7", f"redisson_unlock_latch:{{orders}}:7:{REQUEST}"),
    ],
)
def test_unlock_latch_key(name: str, latch: str) -> None:
    """The unlock latch is redisson_unlock_latch:{name}:<requestId>."""
    assert unlock_latch_key(name, REQUEST) == latch


def test_fair_lock_keys() -> None:
    """Fair lock: queue, timeout zset and per-waiter channel base, each in prefix form."""
    assert fair_queue_key("orders") == "redisson_lock_queue:{orders}"
    assert fair_timeout_key("orders") == "redisson_lock_timeout:{orders}"
    assert fair_channel_base("orders") == "redisson_lock__channel:{orders}"
    assert fair_queue_key("{o}x") == "redisson_lock_queue:{o}x"
    assert fair_timeout_key("{o}x") == "redisson_lock_timeout:{o}x"
    assert fair_channel_base("{o}x") == "redisson_lock__channel:{o}x"


def test_rwlock_channel() -> None:
    """The read-write lock channel is redisson_rwlock:{name}."""
    assert rwlock_channel("orders") == "redisson_rwlock:{orders}"
    assert rwlock_channel("{o}x") == "redisson_rwlock:{o}x"


def test_rwlock_timeout_prefix() -> None:
    """Read-hold timeout keys start {name}:<holder>:rwlock_timeout (name:... with braces)."""
    assert rwlock_timeout_prefix("orders", HOLDER) == f"{{orders}}:{HOLDER}:rwlock_timeout"
    assert rwlock_timeout_prefix("{o}x", HOLDER) == f"{{o}}x:{HOLDER}:rwlock_timeout"


def test_write_holder() -> None:
    """A write hold's field is the holder id with a :write suffix."""
    assert write_holder(HOLDER) == f"{HOLDER}:write"


@pytest.mark.parametrize("name", ["orders", "svc:orders", "{orders}:7", "a{tag}b", "ü:β"])
def test_derived_names_share_the_main_key_slot(name: str) -> None:
    """Every derived key and channel lands in the Cluster slot of the main key."""
    derived = [
        lock_channel(name),
        unlock_latch_key(name, REQUEST),
        fair_queue_key(name),
        fair_timeout_key(name),
        f"{fair_channel_base(name)}:{HOLDER}",
        rwlock_channel(name),
        f"{rwlock_timeout_prefix(name, HOLDER)}:1",
    ]
    slot = key_slot(name.encode())
    assert {key: key_slot(key.encode()) for key in derived} == dict.fromkeys(derived, slot)
