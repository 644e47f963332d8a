"""Client options and the validation of every time and name the public API accepts.

Everything here runs before any I/O, so bad input fails early with a message that names the
argument.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import TypedDict, Unpack, cast

__all__ = (
    "MAX_COUNT",
    "MAX_MS",
    "MAX_SECONDS",
    "MIN_WATCHDOG_SECONDS",
    "ClientOptions",
    "Options",
    "Settings",
    "UrlOptions",
    "check_count",
    "check_name",
    "check_owner",
    "check_url_options",
    "lease_seconds",
    "wait_seconds",
)

TimeArg = float | int | timedelta | None

#: The longest time any argument may give: 10**9 s, about 31.7 years. A hold's expiry is
#: stored as now_ms + ms in an int64 (PEXPIRE and SET PX fail once that overflows, after
#: the script may have written), Lua's numbers are doubles (exact to 2**53, about 9e15),
#: and Redis turns a Lua number into a command argument with %.17g (an integer only below
#: 1e17). The scripts add times to the clock (1.8e12 ms now) and to each other (the fair
#: lock's deadlines): 1e12 ms keeps every such sum exact and far inside all three bounds,
#: and no lease, wait or timeout needs more than 30 years. "Never" is None (the watchdog,
#: or no limit), not a huge number. lua/fragments/times.lua holds the same bound.
MAX_SECONDS = 10**9
MAX_MS = MAX_SECONDS * 1000
#: The shortest watchdog_timeout: 0.01 s. Locks taken without a lease are renewed every
#: third of it; a third under ~3 ms is below a round trip plus an event-loop tick on a busy
#: host, so the lease would lapse between renewals. (And the lease may never round to 0
#: ms: PEXPIRE 0 deletes the lock inside the acquire that took it.)
MIN_WATCHDOG_SECONDS = 0.01
#: Counts and permits are stored as Redis integers: int64 (INCRBY, DECRBY and DECR refuse
#: anything beyond).
MAX_COUNT = 2**63 - 1


def _seconds(value: object, arg: str) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    # bool is an int, but `lease=True` is always a mistake.
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"{arg} must be a number of seconds or a timedelta, not {type(value).__name__}"
        )
    else:
        seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{arg} must be finite, got {value!r} (use None for no limit)")
    if seconds > MAX_SECONDS:
        raise ValueError(
            f"{arg} must be at most {MAX_SECONDS} seconds (about 31 years), got {value!r}"
            " (use None for no limit)"
        )
    return seconds


def lease_seconds(value: object, arg: str = "lease") -> float | None:
    """Validate a lease: ``None`` (watchdog) or a finite number of seconds > 0."""
    if value is None:
        return None
    seconds = _seconds(value, arg)
    if seconds <= 0:
        raise ValueError(f"{arg} must be > 0 seconds, got {value!r} (use None for the watchdog)")
    # Redis takes whole milliseconds; a lease that rounds to 0 ms would expire at once.
    if seconds < 0.001:
        raise ValueError(f"{arg} must be at least 0.001 seconds, got {value!r}")
    return seconds


def wait_seconds(value: object, arg: str = "wait") -> float | None:
    """Validate a wait: ``None`` (no limit) or a finite number of seconds >= 0."""
    if value is None:
        return None
    seconds = _seconds(value, arg)
    if seconds < 0:
        raise ValueError(f"{arg} must be >= 0 seconds, got {value!r} (use None to wait forever)")
    return seconds


def _hash_tag_ok(name: str) -> bool:
    # Redis Cluster hashes by the content between the first "{" and the next "}", if that
    # content is non-empty. Derived keys wrap the name in braces only when it has no "{":
    # a name with a "{" but no valid tag, or with a "}" but no "{" ("job}1" becomes
    # "{job}1}", tag "job"), would scatter one lock's keys over two slots.
    start = name.find("{")
    if start < 0:
        return "}" not in name
    end = name.find("}", start + 1)
    return end > start + 1


def _brace_fault(text: str) -> str:
    brace = "'{' without a valid hash tag" if "{" in text else "'}' without a '{'"
    return (
        f"has a {brace}: its keys would land in different cluster slots (use a non-empty"
        " '{tag}' or no braces)"
    )


def check_key_prefix(prefix: object) -> str:
    """Validate ``key_prefix``: a ``str`` with no braces, or with a valid hash tag.

    The rule is the name's (see ``check_name``), so prefix + name, the key, is valid for
    every valid name: a prefix with a tag puts all keys in its slot; one without braces
    leaves the name's tag, if any, in charge.
    """
    if not isinstance(prefix, str):
        raise TypeError(f"key_prefix must be a str, not {type(prefix).__name__}")
    if not _hash_tag_ok(prefix):
        raise ValueError(f"key_prefix {prefix!r} {_brace_fault(prefix)}")
    return prefix


def check_name(name: object, what: str = "name") -> str:
    """Validate a lock name: a non-empty ``str`` whose hash tag, if any, is valid."""
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError(f"{what} must be a non-empty str")
    if not _hash_tag_ok(name):
        raise ValueError(f"{what} {name!r} {_brace_fault(name)}")
    return name


def check_count(value: object, what: str, *, minimum: int) -> int:
    """Validate a number of permits or a count: an ``int`` (not a bool) >= ``minimum``.

    At most ``MAX_COUNT``: the server stores it as an int64.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    if value > MAX_COUNT:
        raise ValueError(f"{what} must be at most 2**63 - 1 (a Redis integer), got {value}")
    return value


def check_owner(owner: object) -> str | None:
    """Validate ``owner=``: ``None`` or a non-empty ``str``."""
    if owner is None:
        return None
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a str, not {type(owner).__name__}")
    if not owner:
        raise ValueError("owner must be a non-empty str")
    return owner


class Options(TypedDict, total=False):
    """The client's keyword options, as ``Client(redis, **options)`` takes them.

    Written once here: the client, ``from_url``, the sync client and the integrations take
    ``**options`` of this type, so a type checker checks a caller's names and types, and
    `ClientOptions` holds the defaults and the validation.
    """

    watchdog_timeout: TimeArg
    key_prefix: str
    subscribe_timeout: TimeArg
    retry_attempts: int
    retry_interval: TimeArg
    fair_lock_wait_timeout: TimeArg
    replica_acks: int
    replica_ack_timeout: TimeArg
    slow_wait: TimeArg
    slow_hold: TimeArg
    restart_grace: TimeArg


class UrlOptions(Options, total=False):
    """``from_url``'s options: the client's, and ``cluster`` (``url`` names a cluster node)."""

    cluster: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientOptions:
    """The client's options, validated once at construction; the defaults are these.

    Times are seconds. ``watchdog_timeout`` is the lease of locks taken without ``lease``;
    the renewal task renews them every third of it.
    """

    watchdog_timeout: float = 30.0
    key_prefix: str = ""
    subscribe_timeout: float = 7.5
    retry_attempts: int = 3
    retry_interval: float = 0.2
    fair_lock_wait_timeout: float = 300.0
    replica_acks: int = 0
    replica_ack_timeout: float = 1.0
    #: A WARNING when an acquire waited longer than this, or a lock is held longer (None: off).
    slow_wait: float | None = 5.0
    slow_hold: float | None = 60.0
    #: Strict restarts (None: off): no acquire on a server until it has been up this long
    #: (``_net/restarts.py``); set it to the longest lease in use.
    restart_grace: float | None = None

    @classmethod
    def build(cls, **options: Unpack[Options]) -> ClientOptions:
        """Validate raw keyword options and return the frozen options."""
        _check_names(options)
        key_prefix = options.get("key_prefix", _DEFAULTS.key_prefix)
        check_key_prefix(key_prefix)
        retry_attempts = options.get("retry_attempts", _DEFAULTS.retry_attempts)
        if isinstance(retry_attempts, bool) or not isinstance(retry_attempts, int):
            raise TypeError(f"retry_attempts must be an int, not {type(retry_attempts).__name__}")
        if not 0 <= retry_attempts <= _MAX_RETRY_ATTEMPTS:
            raise ValueError(
                f"retry_attempts must be >= 0 and <= {_MAX_RETRY_ATTEMPTS}, got {retry_attempts}"
            )
        replica_acks = options.get("replica_acks", _DEFAULTS.replica_acks)
        if isinstance(replica_acks, bool) or not isinstance(replica_acks, int):
            raise TypeError(f"replica_acks must be an int, not {type(replica_acks).__name__}")
        if not 0 <= replica_acks <= MAX_COUNT:
            raise ValueError(f"replica_acks must be >= 0 and <= 2**63 - 1, got {replica_acks}")
        return cls(
            watchdog_timeout=_positive(
                options.get("watchdog_timeout", _DEFAULTS.watchdog_timeout),
                "watchdog_timeout",
                MIN_WATCHDOG_SECONDS,
            ),
            key_prefix=key_prefix,
            subscribe_timeout=_positive(
                options.get("subscribe_timeout", _DEFAULTS.subscribe_timeout), "subscribe_timeout"
            ),
            retry_attempts=retry_attempts,
            retry_interval=_non_negative(
                options.get("retry_interval", _DEFAULTS.retry_interval), "retry_interval"
            ),
            # Both are sent in ms (the fair lock's W, WAIT's timeout): never 0 ms.
            fair_lock_wait_timeout=_positive(
                options.get("fair_lock_wait_timeout", _DEFAULTS.fair_lock_wait_timeout),
                "fair_lock_wait_timeout",
                0.001,
            ),
            replica_acks=replica_acks,
            replica_ack_timeout=_positive(
                options.get("replica_ack_timeout", _DEFAULTS.replica_ack_timeout),
                "replica_ack_timeout",
                0.001,
            ),
            slow_wait=wait_seconds(options.get("slow_wait", _DEFAULTS.slow_wait), "slow_wait"),
            slow_hold=wait_seconds(options.get("slow_hold", _DEFAULTS.slow_hold), "slow_hold"),
            restart_grace=_restart_grace(options.get("restart_grace")),
        )


_DEFAULTS = ClientOptions()
_OPTION_NAMES = frozenset(field.name for field in fields(ClientOptions))


def check_url_options(options: UrlOptions) -> None:
    """Validate ``from_url``'s options without connecting.

    For helpers that make their client later (at an app's startup): bad input still fails
    where it was given.
    """
    rest = dict(options)
    cluster = rest.pop("cluster", False)
    if not isinstance(cluster, bool):
        raise TypeError(f"cluster must be a bool, not {type(cluster).__name__}")
    ClientOptions.build(**cast(Options, rest))


def _check_names(options: Mapping[str, object]) -> None:
    """Refuse an unknown option by name, as Python refuses an unknown keyword argument.

    ``**options`` accepts any name at run time; only a type checker sees the TypedDict.
    """
    unknown = sorted(set(options) - _OPTION_NAMES)
    if unknown:
        raise TypeError(
            f"unknown option {unknown[0]!r}; the options are: {', '.join(sorted(_OPTION_NAMES))}"
        )


#: More tries than this only multiply the unlock latches' lifetime (see Client): a call
#: is resent for as long as its latch lives, and the latch must stay a time the server
#: can store.
_MAX_RETRY_ATTEMPTS = 1000


def _restart_grace(value: object) -> float | None:
    return None if value is None else _positive(value, "restart_grace")


def _positive(value: object, arg: str, minimum: float = 0.0) -> float:
    if value is None:
        raise TypeError(f"{arg} must be a number of seconds, not None")
    seconds = _seconds(value, arg)
    if seconds <= 0:
        raise ValueError(f"{arg} must be > 0 seconds, got {value!r}")
    if seconds < minimum:
        raise ValueError(f"{arg} must be at least {minimum} seconds, got {value!r}")
    return seconds


def _non_negative(value: object, arg: str) -> float:
    if value is None:
        raise TypeError(f"{arg} must be a number of seconds, not None")
    seconds = _seconds(value, arg)
    if seconds < 0:
        raise ValueError(f"{arg} must be >= 0 seconds, got {value!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class Settings:
    """What the engine and the primitives derive from the options and the connection.

    Times in ms are what the scripts take; ``ttl_cap`` and ``retry_interval`` are seconds.
    """

    #: The watchdog lease, and the lease of a hold whose lease is unknown.
    lease_ms: int
    #: How long every unlock latch and acquire tombstone lives: beyond every resend of
    #: its call (see Client).
    latch_ttl_ms: int
    #: How long a cut-off call is resent in the background at most.
    resend_window_ms: int
    #: A wait for a lock without expiry (a foreign holder) is still bounded by this.
    ttl_cap: float
    #: W of a fair-lock wait without a wait of its own.
    fair_wait_ms: int
    #: The pause between resends.
    retry_interval: float
    #: Prepended to every lock name to make its key.
    key_prefix: str = ""
    #: The command that publishes from a script: PUBLISH (SPUBLISH on a sharded cluster).
    publish: str = "PUBLISH"
    #: The client talks to a Redis Cluster (some names cannot work there).
    cluster: bool = False
    #: Replicas that must acknowledge each acquisition (0: none asked), and how long the
    #: server waits for them.
    replica_acks: int = 0
    replica_ack_timeout: float = 1.0
    #: The server as the connection settings name it (a composite lock orders its members
    #: by it, after the key: ``_timing.server_of``).
    server: str = ""

    def __post_init__(self) -> None:
        # The times derived from the options and the connection's timeouts are sent as
        # expiries: each must be one the server can store (see MAX_SECONDS), and never 0 ms.
        for what, ms in (
            ("the watchdog lease", self.lease_ms),
            ("the unlock latches' lifetime", self.latch_ttl_ms),
            ("the resend window", self.resend_window_ms),
            ("the fair lock's wait", self.fair_wait_ms),
        ):
            if not 1 <= ms <= MAX_MS:
                raise ValueError(
                    f"{what} would be {ms} ms, outside 1 ms .. {MAX_SECONDS} s: lower"
                    " watchdog_timeout, retry_attempts, retry_interval or the connection's"
                    " socket timeouts"
                )
