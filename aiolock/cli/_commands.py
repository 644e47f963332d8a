"""The ``aiolock`` command: inspect, list, force-unlock and watch locks in Redis.

Each command connects, does its one thing and closes. Errors are one line on stderr and an
exit code (``EXIT_CODES``), never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import click
from redis.exceptions import AskError, RedisClusterException, RedisError
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from .._client import Client
from .._exceptions import LockError, LockLostError, LockNotOwnedError
from .._net.resp import from_redis_py
from ._connect import BadUrlError, connected
from ._inspect import KINDS, NOT_LOCKS, Inspector, UnknownKindError
from ._listing import Lister
from ._render import object_view, objects_table

__all__ = ("cli", "main")

F = TypeVar("F", bound=Callable[..., Any])

#: What each exit status means (also in ``aiolock --help``).
EXIT_CODES = {
    0: "done",
    1: "no such object (or nothing was unlocked)",
    2: "bad usage: an option, the URL, a kind the command does not take, no terminal to ask on",
    3: "Redis could not be reached or answered with an error",
}
_EPILOG = "\b\nExit status:\n" + "\n".join(f"  {code}  {text}" for code, text in EXIT_CODES.items())


class Failure(Exception):
    """A one-line error the command ends with, and its exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _connection_options(command: F) -> F:
    """The options every command takes to reach Redis, and ``--json``."""
    for option in reversed(
        (
            click.option("--cluster", is_flag=True, help="URL names a node of a Redis Cluster."),
            click.option(
                "--sentinel",
                metavar="PRIMARY",
                help="URL names Sentinels (redis://h1:26379,h2:26379[/db]); "
                "use their primary PRIMARY.",
            ),
            click.option(
                "--key-prefix",
                default="",
                show_default=False,
                help="The key_prefix the clients use (default none, as Redisson).",
            ),
            click.option("--json", "as_json", is_flag=True, help="Machine output (JSON)."),
        )
    ):
        command = option(command)
    return command


def _run(body: Callable[[], Awaitable[int]]) -> int:
    """Run one command's coroutine; its errors become `Failure`."""
    try:
        return asyncio.run(body())  # type: ignore[arg-type]
    except BadUrlError as exc:
        raise Failure(str(exc), 2) from None
    except UnknownKindError as exc:
        raise Failure(f"unknown kind: {exc}", 2) from None
    except AskError as exc:
        raise _cluster_node(exc) from None
    except RedisClusterException as exc:
        if "not enabled" in str(exc):
            raise Failure(
                "the server is not a node of a Redis Cluster: drop --cluster", 2
            ) from None
        raise Failure(_one_line(exc), 3) from None
    except (RedisError, OSError, LockError) as exc:
        # Named by the reply's first word too: redis-py 5.0's plain client raises MOVED as a
        # bare ResponseError("MOVED 7708 host:port"), where later ones raise MovedError.
        named = from_redis_py(exc)
        if isinstance(named, AskError):
            raise _cluster_node(named) from None
        # LockError: aiolock's own refusals of a server (an ACL user missing a command the
        # scripts need), as one line like the server's.
        raise Failure(_one_line(exc), 3) from None


def _cluster_node(exc: AskError) -> Failure:
    """The failure of a redirect (MOVED or ASK: MovedError is an AskError).

    The server is a cluster node the command was not told of (one whose user may not run
    INFO, which tells it otherwise).
    """
    return Failure(
        f"the server is a node of a Redis Cluster (it redirects to {exc.host}:{exc.port}): "
        "pass --cluster",
        2,
    )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def _console() -> Console:
    # Names are shown as they are: no [markup], :emoji: or highlighting in them.
    return Console(highlight=False, markup=False, emoji=False)


def _missing(name: str) -> Failure:
    return Failure(f"{name!r} does not exist (no lock, semaphore or latch of that name)", 1)


@click.group(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=_EPILOG,
)
def cli() -> None:
    """Inspect and repair aiolock's and Redisson's locks in Redis.

    URL is what Client.from_url takes: redis://[user:password@]host:port[/db],
    rediss://... (TLS) or unix:///path.sock; with --cluster a node of a Redis Cluster, with
    --sentinel PRIMARY the Sentinels to ask for PRIMARY.
    """


@cli.command(short_help="Show one object: kind, holders, leases, queue, waiters.")
@click.argument("url")
@click.argument("name")
@_connection_options
def inspect(
    *, url: str, name: str, cluster: bool, sentinel: str | None, key_prefix: str, as_json: bool
) -> None:
    """Show one object: kind, holders, lease left, queue, waiters, permits, token."""

    async def body() -> int:
        async with connected(url, cluster=cluster, sentinel=sentinel) as redis:
            info = await Inspector(redis, key_prefix=key_prefix).inspect(name)
        if info is None:
            raise _missing(name)
        if as_json:
            _print_json(info)
        else:
            _console().print(object_view(info))
        return 0

    sys.exit(_run(body))


@cli.command(name="list", short_help="List the lock-like objects matching PATTERN.")
@click.argument("url")
@click.argument("pattern", default="*")
@_connection_options
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Show at most this many objects.",
)
@click.option(
    "--scan-limit",
    type=click.IntRange(min=1),
    default=100_000,
    show_default=True,
    help="Look at most at this many keys (per pattern).",
)
def list_(
    *,
    url: str,
    pattern: str,
    cluster: bool,
    sentinel: str | None,
    key_prefix: str,
    as_json: bool,
    limit: int,
    scan_limit: int,
) -> None:
    """List the lock-like objects whose names match PATTERN (a SCAN glob, default *).

    On a cluster every primary is scanned. With the default pattern, integer strings
    nobody waits on (a semaphore or latch, or any counter) are left out. Keys are read a
    SCAN page at a time, in pipelines; --json is written as the pages are read (sorted
    within a page).
    """

    async def body() -> int:
        async with connected(url, cluster=cluster, sentinel=sentinel) as redis:
            inspector = Lister(redis, key_prefix=key_prefix)
            objects = inspector.objects(pattern, limit=limit, scan_budget=scan_limit)
            if as_json:
                # Streamed, an object a line, as the pages are read: memory stays bounded
                # whatever --limit is, and the whole output is still one JSON document.
                out = sys.stdout
                out.write('{"objects": [')
                sep = "\n"
                async for info in objects:
                    out.write(sep + json.dumps(info))
                    sep = ",\n"
                out.write(f'\n], "truncated": {json.dumps(inspector.truncated)}}}\n')
                out.flush()
                return 0
            found = [info async for info in objects]
        _console().print(objects_table(found, truncated=inspector.truncated))
        return 0

    sys.exit(_run(body))


async def _force(client: Client, name: str, info: dict[str, Any]) -> bool:
    """Unlock as Redisson's forceUnlock does for the kind: the library's own scripts."""
    kind = info["kind"]
    if kind == "fair_lock":
        return await client.fair_lock(name).force_unlock()
    if kind == "fenced_lock":
        return await client.fenced_lock(name).force_unlock()
    if kind == "read_write_lock":
        pair = client.read_write_lock(name)
        side = pair.write_lock() if info.get("mode") == "write" else pair.read_lock()
        return await side.force_unlock()
    if kind == "fair_read_write_lock":
        # Either view's force_unlock deletes every hold and wakes every waiter.
        return await client.fair_read_write_lock(name).write_lock().force_unlock()
    # A reentrant or spin lock (one layout): RLock's forceUnlock, which publishes 0.
    return await client.lock(name).force_unlock()


@cli.command(name="force-unlock", short_help="Delete a lock and wake its waiters (asks first).")
@click.argument("url")
@click.argument("name")
@_connection_options
@click.option("--yes", "-y", is_flag=True, help="Do not ask (required without a terminal).")
def force_unlock(
    *,
    url: str,
    name: str,
    cluster: bool,
    sentinel: str | None,
    key_prefix: str,
    as_json: bool,
    yes: bool,
) -> None:
    """Delete a lock whoever holds it and wake its waiters, as Redisson's forceUnlock.

    A holder finds its lock gone at its next renewal or release. Asks first.
    """
    if not yes and not sys.stdin.isatty():
        raise Failure(f"not unlocking {name!r}: no terminal to confirm on (pass --yes)", 2)

    async def body() -> int:
        async with connected(url, cluster=cluster, sentinel=sentinel) as redis:
            try:
                info = await Inspector(redis, key_prefix=key_prefix).inspect(name)
            except UnknownKindError as exc:
                # Not a lock (an application's hash or string): never deleted.
                raise Failure(f"not unlocking: {exc}; nothing was deleted", 1) from None
            if info is None:
                raise _missing(name)
            if info["kind"] in NOT_LOCKS:
                hint = (
                    " (its stuck permits: aiolock release-permit)"
                    if info["kind"] == "permit_expirable_semaphore"
                    else ""
                )
                raise Failure(
                    f"{name!r} is a {KINDS[info['kind']]}: it has no holder to unlock{hint}", 2
                )
            if not yes:
                _console().print(object_view(info))
                if not click.confirm(f"Force-unlock {name!r}?", default=False):
                    raise Failure(f"{name!r} not unlocked", 1)
            client = Client(redis, key_prefix=key_prefix)
            try:
                unlocked = await _force(client, name, info)
            finally:
                await client.aclose()
        if as_json:
            _print_json({"name": name, "kind": info["kind"], "unlocked": unlocked})
        elif unlocked:
            click.echo(f"{name!r} unlocked: its waiters were woken")
        if not unlocked:
            raise Failure(f"{name!r} was not held: nothing unlocked", 1)
        return 0

    sys.exit(_run(body))


@cli.command(
    name="release-permit",
    short_help="Give back stuck permits of a permit-expirable semaphore (asks first).",
)
@click.argument("url")
@click.argument("name")
@click.argument("permit_id", required=False)
@_connection_options
@click.option("--all", "every", is_flag=True, help="Every permit taken (instead of PERMIT_ID).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask (required without a terminal).")
def release_permit(
    *,
    url: str,
    name: str,
    permit_id: str | None,
    cluster: bool,
    sentinel: str | None,
    key_prefix: str,
    as_json: bool,
    every: bool,
    yes: bool,
) -> None:
    """Give back PERMIT_ID (or --all permits) of the permit-expirable semaphore NAME.

    For a permit whose holder died with a long lease: it is back at once, and a waiter
    is woken. The holder, if alive, finds it gone at its release. Asks first.
    """
    if (permit_id is None) == (not every):
        raise Failure("name one PERMIT_ID or pass --all (not both)", 2)
    if not yes and not sys.stdin.isatty():
        raise Failure(
            f"not releasing permits of {name!r}: no terminal to confirm on (pass --yes)", 2
        )

    async def body() -> int:
        async with connected(url, cluster=cluster, sentinel=sentinel) as redis:
            try:
                info = await Inspector(redis, key_prefix=key_prefix).inspect(name)
            except UnknownKindError as exc:
                raise Failure(f"not releasing: {exc}; nothing was changed", 1) from None
            if info is None:
                raise _missing(name)
            if info["kind"] == "semaphore_or_latch":
                # A permit-expirable semaphore with no permit taken looks just like this.
                raise Failure(
                    f"{name!r} has no permit taken (no expiry set: a semaphore or latch "
                    "as stored): nothing released",
                    1,
                )
            if info["kind"] != "permit_expirable_semaphore":
                raise Failure(
                    f"{name!r} is a {KINDS[info['kind']]}, not a permit-expirable semaphore: "
                    "it has no permit ids",
                    2,
                )
            ids = _permits_named(name, info, permit_id)
            if not yes:
                _console().print(object_view(info))
                if not click.confirm(f"Release {len(ids)} permit(s) of {name!r}?", default=False):
                    raise Failure("no permit released", 1)
            released = await _give_back(Client(redis, key_prefix=key_prefix), name, ids)
        if as_json:
            _print_json({"name": name, "released": released})
        else:
            click.echo(f"{name!r}: {len(released)} permit(s) released")
        if not released:
            raise Failure(f"{name!r}: no permit was released (given back meanwhile)", 1)
        return 0

    sys.exit(_run(body))


def _permits_named(name: str, info: dict[str, Any], permit_id: str | None) -> list[str]:
    """The permit ids to release: ``permit_id`` if it is taken, or every one taken."""
    taken: list[str] = [permit["permit_id"] for permit in info["acquired"]]
    if permit_id is not None and permit_id not in taken:
        raise Failure(f"{name!r} has no permit {permit_id!r} taken: nothing released", 1)
    if not taken:
        raise Failure(f"{name!r} has no permit taken: nothing released", 1)
    return taken if permit_id is None else [permit_id]


async def _give_back(client: Client, name: str, ids: list[str]) -> list[str]:
    """Release each permit of ``ids``; the ids released (closes ``client``)."""
    released: list[str] = []
    try:
        sem = client.permit_expirable_semaphore(name)
        for one in ids:
            try:
                await sem.release(one)
            except LockNotOwnedError:
                continue  # given back meanwhile by its holder (or its lease ran out)
            except LockLostError:
                pass  # its lease had run out: it is back all the same
            released.append(one)
    finally:
        await client.aclose()
    return released


@cli.command(short_help="Inspect NAME live until Ctrl-C.")
@click.argument("url")
@click.argument("name")
@_connection_options
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    help="Seconds between refreshes (at least 0.1).",
)
def watch(
    *,
    url: str,
    name: str,
    cluster: bool,
    sentinel: str | None,
    key_prefix: str,
    as_json: bool,
    interval: float,
) -> None:
    """Inspect NAME again every --interval seconds until Ctrl-C.

    With --json, one JSON object per line per refresh (null while NAME does not exist).
    """

    async def body() -> int:
        stop = _stop_on_ctrl_c()
        async with connected(url, cluster=cluster, sentinel=sentinel) as redis:
            inspector = Inspector(redis, key_prefix=key_prefix)
            if as_json:
                while not stop.is_set():
                    info = await inspector.inspect(name)
                    click.echo(json.dumps({"at": time.time(), "object": info}))
                    sys.stdout.flush()
                    await _pause(stop, interval)
                return 0
            with Live(console=_console(), auto_refresh=False) as live:
                while not stop.is_set():
                    info = await inspector.inspect(name)
                    header = Text(
                        f"aiolock watch {name}  every {interval:g} s, Ctrl-C to stop  "
                        f"{time.strftime('%H:%M:%S')}",
                        style="dim",
                    )
                    view = object_view(info) if info is not None else Text("(does not exist)")
                    live.update(Group(header, view), refresh=True)
                    await _pause(stop, interval)
            return 0

    try:
        sys.exit(_run(body))
    except KeyboardInterrupt:
        sys.exit(0)


def _stop_on_ctrl_c() -> asyncio.Event:
    """An event Ctrl-C sets; a second Ctrl-C interrupts at once (a server that hangs).

    Watching ends at the next refresh, not by cancelling the command at whatever await
    it is in: on Python 3.11 redis-py's ``asyncio.wait_for`` can swallow that cancel, and
    the watch would go on for ever.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def pressed() -> None:
        if stop.is_set():
            # Python's own handler again, and its KeyboardInterrupt now.
            loop.remove_signal_handler(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        stop.set()

    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        loop.add_signal_handler(signal.SIGINT, pressed)
    return stop


async def _pause(stop: asyncio.Event, interval: float) -> None:
    """Wait ``interval`` seconds, or less if ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(interval):
            await stop.wait()


def main(argv: list[str] | None = None) -> NoReturn:
    """The console script: run a command, turn every error into one line and a status."""
    try:
        code = cli.main(args=argv, prog_name="aiolock", standalone_mode=False)
    except Failure as exc:
        click.echo(f"aiolock: {exc}", err=True)
        sys.exit(exc.code)
    except click.exceptions.NoArgsIsHelpError as exc:
        # ``aiolock`` alone: the help, as a usage error.
        click.echo(exc.ctx.get_help())
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"aiolock: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("aiolock: aborted", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
