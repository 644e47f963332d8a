"""``@client.locked(template, ...)``: each call of the function holds a guarded lock.

The lock's name is ``template`` formatted from the call's arguments.

Everything that can be checked without a call is checked when the function is decorated
(the template's fields against the function's parameters, the kind, the times), so a typo
fails at import time rather than on the first request. Each call binds its arguments as
the function would (defaults applied), formats the name, and holds the lock with
``guarded()`` for the call: the call is cancelled if the hold is lost, and then raises
``LockLostError``.
"""

from __future__ import annotations

import functools
import inspect
import string
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeAlias, TypeVar

from .._config import check_name, lease_seconds, wait_seconds
from ..events import KINDS as EVENT_KINDS
from ..events import Kind

if TYPE_CHECKING:
    from .fair_lock import FairLock
    from .fair_rwlock import FairReadWriteLock
    from .fenced import FencedLock
    from .handle import LockHandle
    from .lock import Lock
    from .rwlock import ReadWriteLock
    from .spin import SpinLock

__all__ = ("LockKind", "check_kind", "lock_of_kind", "locked")

P = ParamSpec("P")
R = TypeVar("R")

#: The lock kinds ``locked(kind=...)`` takes: the client's factories of lock handles, and
#: the views of both read-write locks (the kinds events name).
LockKind: TypeAlias = Kind
KINDS: tuple[str, ...] = EVENT_KINDS


def check_kind(kind: object) -> LockKind:
    """Validate ``kind=``: one of `LockKind`."""
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str, not {type(kind).__name__}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}; got {kind!r}")
    return kind  # type: ignore[return-value]  # checked against LockKind's values above


class Client(Protocol):
    """The client's handle factories: all this module needs of ``aiolock.Client``.

    The client builds the decorator, so naming its class here would make an import cycle.
    """

    def lock(self, name: str) -> Lock: ...
    def fair_lock(self, name: str) -> FairLock: ...
    def fenced_lock(self, name: str) -> FencedLock: ...
    def spin_lock(self, name: str) -> SpinLock: ...
    def read_write_lock(self, name: str) -> ReadWriteLock: ...
    def fair_read_write_lock(self, name: str) -> FairReadWriteLock: ...


_FACTORIES: dict[str, Callable[[Client, str], LockHandle]] = {
    "lock": lambda client, name: client.lock(name),
    "fair_lock": lambda client, name: client.fair_lock(name),
    "fenced_lock": lambda client, name: client.fenced_lock(name),
    "spin_lock": lambda client, name: client.spin_lock(name),
    "read_lock": lambda client, name: client.read_write_lock(name).read_lock(),
    "write_lock": lambda client, name: client.read_write_lock(name).write_lock(),
    "fair_read_lock": lambda client, name: client.fair_read_write_lock(name).read_lock(),
    "fair_write_lock": lambda client, name: client.fair_read_write_lock(name).write_lock(),
}
assert set(_FACTORIES) == set(KINDS)


def lock_of_kind(client: Client, kind: LockKind, name: str) -> LockHandle:
    """The handle of lock ``kind`` named ``name`` on ``client``."""
    return _FACTORIES[kind](client, name)


def _template_fields(template: str) -> set[str]:
    """The argument names ``template`` formats (``{order.id}`` names ``order``).

    Raises ValueError for a malformed template or a positional field (``{}``, ``{0}``): a
    call's arguments are formatted by name.
    """
    names: set[str] = set()
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"lock name template {template!r} is malformed: {exc}") from None
    for _, field, _, _ in parsed:
        if field is None:
            continue
        root = field.partition(".")[0].partition("[")[0]
        if not root or root.isdigit():
            raise ValueError(
                f"lock name template {template!r} has a positional field {{{field}}}: "
                "name the argument, as in 'orders:{order_id}'"
            )
        names.add(root)
    return names


def locked(
    client: Client, template: object, *, wait: object, lease: object, kind: object
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """The decorator ``client.locked(...)`` returns; its arguments are checked here."""
    if not isinstance(template, str):
        raise TypeError(f"template must be a str, not {type(template).__name__}")
    if not template:
        raise ValueError("template must be a non-empty str")
    fields = _template_fields(template)
    wait_s = wait_seconds(wait)
    lease_s = lease_seconds(lease)
    lock_kind = check_kind(kind)

    def decorate(func: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(
                f"@locked decorates coroutine functions (async def); "
                f"{getattr(func, '__qualname__', func)!r} is not one"
            )
        signature = inspect.signature(func)
        params = signature.parameters
        var_keyword = next(
            (p.name for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None
        )
        named = {p.name for p in params.values() if p.kind is not inspect.Parameter.VAR_KEYWORD}
        unknown = fields - named
        if unknown and var_keyword is None:
            raise ValueError(
                f"lock name template {template!r} names "
                f"{', '.join(map(repr, sorted(unknown)))}, which "
                f"{func.__qualname__}() has no parameter for "
                f"(its parameters: {', '.join(params) or 'none'})"
            )

        def name_for(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
            bound = signature.bind(*args, **kwargs)  # a TypeError as the call itself gives
            bound.apply_defaults()
            values = dict(bound.arguments)
            if var_keyword is not None:
                values.update(values.pop(var_keyword))
            try:
                name = template.format_map(values)
            except (KeyError, AttributeError, IndexError, TypeError, ValueError) as exc:
                raise ValueError(
                    f"lock name template {template!r} could not be formatted from the "
                    f"arguments of {func.__qualname__}(): {type(exc).__name__}: {exc}"
                ) from exc
            return check_name(name, f"lock name formatted from {template!r}")

        @functools.wraps(func)
        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            lock = lock_of_kind(client, lock_kind, name_for(args, kwargs))
            async with lock.guarded(wait=wait_s, lease=lease_s):
                return await func(*args, **kwargs)

        return call

    return decorate
