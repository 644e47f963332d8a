"""The Redis protocol (RESP) as aiolock's own connections speak it: packing and error replies.

Commands are packed here into the bytes that go on the wire: by hiredis, except the
EVALSHA of every script call, which has a packer of its own (below). Replies are
parsed by hiredis too (see ``wire.py``); an error reply becomes the redis-py exception a
redis-py client would raise for it, so callers catch the same classes whichever connection
answered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, cast

import hiredis
from redis.exceptions import (
    AskError,
    AuthenticationError,
    BusyLoadingError,
    ClusterCrossSlotError,
    ClusterDownError,
    ExecAbortError,
    MasterDownError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)

__all__ = (
    "REPLY_ERRORS",
    "ErrorReply",
    "error_reply",
    "from_redis_py",
    "pack",
    "pack_script",
)

Arg = str | int | bytes

# hiredis packs a plain command in C, faster than formatting it in Python; its stub types
# the argument as a 1-tuple.
_pack_command = cast("Callable[[tuple[Arg, ...]], bytes]", hiredis.pack_command)


def pack(*args: Arg) -> bytes:
    """One command as RESP bytes: an array of bulk strings (str as UTF-8, int in decimal)."""
    return _pack_command(args)


def pack_script(sha: bytes, keys: Sequence[str], args: Sequence[Arg]) -> bytes:
    """``EVALSHA sha len(keys) *keys *args`` as RESP bytes: the hot path of every call.

    The same bytes as hiredis packs (tests/test_resp.py compares them) at less cost: hiredis
    formats every length with sprintf, while here the command's head is made once per
    shape and the arguments (a lock's keys, a holder id, a lease: most repeat from call to
    call) come packed from a cache, looked up without leaving C.
    """
    head = _heads.get((sha, len(keys), len(args)))
    if head is None:
        head = _head(sha, len(keys), len(args))
    bulks = _bulks
    if len(bulks) >= _BULKS_LIMIT:
        # Cleared, not evicted one by one: each call's own latch or tombstone name passes
        # through once, and the arguments that repeat are packed again at once.
        bulks.clear()
    return b"".join([head, *map(bulks.__getitem__, keys), *map(bulks.__getitem__, args)])


class _Bulks(dict[object, bytes]):
    """Packed bulk strings by argument; a missing one is packed and kept.

    A key equal to another shares its entry: True is 1 (packed "1"), and 1.0 may find 1's
    "1" where hiredis would send "1.0": the same number to a script's ``tonumber``.
    """

    def __missing__(self, arg: object) -> bytes:
        bulk = self[arg] = _bulk(arg)
        return bulk


# The packed head of an EVALSHA per (script, key count, argument count).
_heads: dict[tuple[bytes, int, int], bytes] = {}
_bulks = _Bulks()
_BULKS_LIMIT = 4096


def _head(sha: bytes, nkeys: int, nargs: int) -> bytes:
    head = _heads[sha, nkeys, nargs] = b"*%d\r\n%s%s%s" % (
        3 + nkeys + nargs,
        _bulk(b"EVALSHA"),
        _bulk(sha),
        _bulk(nkeys),
    )
    return head


def _bulk(arg: object) -> bytes:
    """One bulk string, as hiredis packs it.

    str as UTF-8, int in decimal (a bool as 1 or 0, where hiredis refuses it), float as its
    repr, bytes as they are; anything else is refused.
    """
    if isinstance(arg, str):
        data = arg.encode()
    elif isinstance(arg, bytes):
        data = arg
    elif isinstance(arg, int):
        data = b"%d" % arg
    elif isinstance(arg, float):
        data = repr(arg).encode()
    else:
        raise TypeError(f"aiolock: cannot send {type(arg).__name__} {arg!r} to Redis")
    return b"$%d\r\n%s\r\n" % (len(data), data)


class ErrorReply(Exception):
    """An error reply as the parser hands it over, before `error_reply()` names it."""


# Error codes (the reply's first word) that redis-py answers with a class of its own. The
# code is dropped from the message, as redis-py does; every other error is a ResponseError
# with the whole text.
_CLASSES: Final[dict[str, type[Exception]]] = {
    "NOSCRIPT": NoScriptError,
    "LOADING": BusyLoadingError,
    "READONLY": ReadOnlyError,
    "NOPERM": NoPermissionError,
    "OOM": OutOfMemoryError,
    "WRONGPASS": AuthenticationError,
    "NOAUTH": AuthenticationError,
    "EXECABORT": ExecAbortError,
    "MASTERDOWN": MasterDownError,
    "CLUSTERDOWN": ClusterDownError,
    "CROSSSLOT": ClusterCrossSlotError,
    "TRYAGAIN": TryAgainError,
    "MOVED": MovedError,
    "ASK": AskError,
}


def error_reply(message: str) -> Exception:
    """The redis-py exception for an error reply with text ``message``."""
    if message.startswith("ERR Protocol error: unauthenticated"):
        # Redis 7 refuses a long command from a connection that has not authenticated
        # (and then closes it) with this, not NOAUTH: the cause is the same.
        return AuthenticationError(f"Authentication required ({message})")
    code, _, rest = message.partition(" ")
    cls = _CLASSES.get(code)
    if cls is None:
        return ResponseError(message)
    return cls(rest)


#: What redis-py's parser raises for an error reply: a ResponseError, or one of the two reply
#: classes redis-py derives from its ConnectionError (a reader must not take those for a
#: broken connection).
REPLY_ERRORS: Final = (ResponseError, AuthenticationError, BusyLoadingError)


def from_redis_py(exc: Exception) -> Exception:
    """An error reply as redis-py raised it, made what ``error_reply`` makes of the same text."""
    if isinstance(exc, ResponseError) and str(exc).startswith("Protocol error: unauthenticated"):
        # redis-py dropped the "ERR " code, as it does for every code it knows.
        return error_reply(f"ERR {exc}")
    if type(exc) is ResponseError:
        # A code redis-py left unclassed keeps its text whole ("TRYAGAIN ...": before 5.1
        # its plain client classes TRYAGAIN, CLUSTERDOWN and MASTERDOWN only in the cluster
        # client): named as the direct wire names it, whatever redis-py's version.
        return error_reply(str(exc))
    return exc
