"""The Redis protocol (RESP) as aiolock's own connections speak it: packing and error replies.

Commands are packed here once into the bytes that go on the wire; an EVALSHA carries a
prefix computed once per script. Replies are parsed by hiredis (see ``_wire.py``); an error
reply becomes the redis-py exception a redis-py client would raise for it, so callers catch
the same classes whichever connection answered.
"""

from __future__ import annotations

from typing import Final

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
    "script_prefix",
)

Arg = str | int | bytes


def _bulk(arg: object) -> bytes:
    if isinstance(arg, str):
        data = arg.encode()
    elif isinstance(arg, bytes):
        data = arg
    elif isinstance(arg, int) and not isinstance(arg, bool):
        data = b"%d" % arg
    else:
        # A float or bool here is a bug of the caller: the scripts take whole numbers.
        raise TypeError(f"a command argument must be str, int or bytes, not {type(arg).__name__}")
    return b"$%d\r\n%b\r\n" % (len(data), data)


def pack(*args: Arg) -> bytes:
    """One command as RESP bytes: an array of bulk strings."""
    return b"*%d\r\n%b" % (len(args), b"".join(map(_bulk, args)))


def script_prefix(sha: str) -> bytes:
    """What every EVALSHA of the script with SHA-1 ``sha`` starts with after its length."""
    return _bulk("EVALSHA") + _bulk(sha)


def pack_script(prefix: bytes, keys: list[str], args: list[str | int]) -> bytes:
    """``EVALSHA sha len(keys) *keys *args``, the prefix from :func:`script_prefix`.

    The hot path of every call: the arguments (ASCII in practice: key names, holder ids,
    numbers) are formatted as one text and encoded once, where :func:`pack` encodes each.
    """
    parts = []
    for arg in (*keys, *args):
        text = arg if arg.__class__ is str else _number(arg)
        if not text.isascii():
            # A character of several bytes: the lengths must count bytes.
            return b"*%d\r\n%b%b%b" % (
                3 + len(keys) + len(args),
                prefix,
                _bulk(len(keys)),
                b"".join(map(_bulk, [*keys, *args])),
            )
        parts.append(f"${len(text)}\r\n{text}\r\n")
    return b"*%d\r\n%b$%d\r\n%d\r\n%b" % (
        3 + len(keys) + len(args),
        prefix,
        len(str(len(keys))),
        len(keys),
        "".join(parts).encode(),
    )


def _number(arg: object) -> str:
    if isinstance(arg, int) and not isinstance(arg, bool):
        return str(arg)
    raise TypeError(f"a script argument must be str or int, not {type(arg).__name__}")


class ErrorReply(Exception):
    """An error reply as the parser hands it over, before :func:`error_reply` names it."""


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
    return exc
