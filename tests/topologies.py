"""Local Redis Cluster and Sentinel groups for the tests, from the same server binary as
``aiolock.testing`` picks (a ``redis-server``/``valkey-server`` on PATH or the embedded
Valkey; ``AIOLOCK_TEST_SERVER`` pins it).

Setup waits poll the servers' own reports (``CLUSTER SLOTS``, ``ROLE``, ``SENTINEL ...``)
with a deadline: they wait for state, never for time.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from redis import Redis
from redis.crc import key_slot

from aiolock.testing import find_server_executable

__all__ = (
    "ClusterHandle",
    "Node",
    "SentinelHandle",
    "primary_and_replicas",
    "redis_cluster",
    "redis_sentinel",
)

_HOST = "127.0.0.1"
_SLOTS = 16384
# Cluster bus ports are port + 10000 and must stay valid.
_MAX_PORT = 55535


def _executable() -> str:
    found = find_server_executable()
    if found is None:
        raise RuntimeError("no redis-server or valkey-server found for a local topology")
    return found[0]


def _free_port(*, bus: bool = False) -> int:
    while True:
        with socket.socket() as sock:
            sock.bind((_HOST, 0))
            port: int = sock.getsockname()[1]
        if port > _MAX_PORT and bus:
            continue
        if bus:
            with socket.socket() as sock:
                try:
                    sock.bind((_HOST, port + 10000))
                except OSError:
                    continue
        return port


def _wait(check: Callable[[], bool], what: str, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while True:
        with contextlib.suppress(Exception):
            if check():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"local topology: {what} not reached within {limit} s")
        time.sleep(0.05)


class Node:
    """One server process on a fixed port (restartable with its own config and data)."""

    def __init__(self, executable: str, port: int, workdir: Path, args: list[str]) -> None:
        self.port = port
        self._executable = executable
        self._workdir = workdir
        self._args = args
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> None:
        log = (self._workdir / f"{self.port}.log").open("ab")
        self._process = subprocess.Popen(
            [self._executable, *self._args],
            cwd=self._workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        _wait(self.alive, f"{self.port} answering PING", 10.0)

    def alive(self) -> bool:
        with self.redis(timeout=0.5) as redis:
            return bool(redis.ping())

    def redis(self, timeout: float = 2.0) -> Redis:
        return Redis(host=_HOST, port=self.port, socket_timeout=timeout, decode_responses=True)

    def call(self, *args: Any) -> Any:
        with self.redis() as redis:
            return redis.execute_command(*args)

    def kill(self) -> None:
        """SIGKILL: gone at once, nothing flushed."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: signal.Signals) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(sig)
            process.wait(10)
        self._process = None

    def __repr__(self) -> str:
        return f"Node({self.port})"


class ClusterHandle:
    """A running local cluster."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.url = f"redis://{_HOST}:{nodes[0].port}"

    def _live(self) -> list[Node]:
        return [node for node in self.nodes if node.pid is not None]

    def _by_port(self, port: int) -> Node:
        return next(node for node in self.nodes if node.port == port)

    def slots(self) -> list[tuple[int, int, int]]:
        """(first slot, last slot, primary port) as a live node reports them."""
        for node in self._live():
            with contextlib.suppress(Exception):
                reply = node.call("CLUSTER", "SLOTS")
                return sorted((int(e[0]), int(e[1]), int(e[2][1])) for e in reply)
        raise RuntimeError("no cluster node answers")

    def primaries(self) -> list[Node]:
        ports = sorted({port for _, _, port in self.slots()})
        return [self._by_port(port) for port in ports]

    def node_for_slot(self, slot: int) -> Node:
        for first, last, port in self.slots():
            if first <= slot <= last:
                return self._by_port(port)
        raise RuntimeError(f"slot {slot} is not served")

    def node_for_key(self, key: str) -> Node:
        return self.node_for_slot(key_slot(key.encode()))

    def replicas_of(self, node: Node) -> list[Node]:
        node_id = node.call("CLUSTER", "MYID")
        found = []
        for other in self._live():
            role = other.call("ROLE")
            if role[0] == "slave" and int(role[2]) == node.port:
                found.append(other)
        return found or self._replicas_by_id(node_id)

    def _replicas_by_id(self, node_id: str) -> list[Node]:
        lines = self._live()[0].call("CLUSTER", "NODES").splitlines()
        ports = [
            int(line.split()[1].split("@")[0].rsplit(":", 1)[1])
            for line in lines
            if line.split()[3] == node_id
        ]
        return [self._by_port(port) for port in ports]

    def failover(self, node: Node, *, force: bool = False) -> Node:
        """Promote a replica of ``node`` (CLUSTER FAILOVER); return it once all agree."""
        replica = self.replicas_of(node)[0]
        replica.call("CLUSTER", "FAILOVER", *(["FORCE"] if force else []))
        _wait(lambda: replica.call("ROLE")[0] == "master", "the replica promoted")
        self.wait_stable(lambda: node.port not in {p for _, _, p in self.slots()})
        return replica

    def migrate_slot(self, slot: int, to: Node) -> None:
        """Move ``slot`` and its keys to the primary ``to``."""
        source = self.node_for_slot(slot)
        source_id, target_id = source.call("CLUSTER", "MYID"), to.call("CLUSTER", "MYID")
        to.call("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source.call("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while keys := source.call("CLUSTER", "GETKEYSINSLOT", slot, 100):
            source.call("MIGRATE", _HOST, to.port, "", 0, 5000, "KEYS", *keys)
        for node in [to, source, *(n for n in self.primaries() if n not in (to, source))]:
            node.call("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        self.wait_stable(lambda: self.node_for_slot(slot) is to)

    def unassign_slot(self, slot: int) -> Node:
        """Leave ``slot`` served by no primary (its owner first, so no node learns it back
        from the owner's gossip); return the owner, for ``assign_slot``."""
        owner = self.node_for_slot(slot)
        for node in [owner, *(n for n in self._live() if n is not owner)]:
            node.call("CLUSTER", "DELSLOTS", slot)
        return owner

    def assign_slot(self, slot: int, node: Node) -> None:
        """Give an unassigned ``slot`` to the primary ``node``; the others learn it."""
        node.call("CLUSTER", "ADDSLOTS", slot)
        self.wait_stable(lambda: self.node_for_slot(slot) is node)

    def slot_map_reads(self) -> int:
        """CLUSTER SLOTS calls every live node has answered so far."""
        total = 0
        for node in self._live():
            stats = node.call("INFO", "commandstats")
            total += int(stats.get("cmdstat_cluster|slots", {}).get("calls", 0))
        return total

    def wait_stable(self, also: Callable[[], bool] | None = None) -> None:
        """Until every live node reports the same full slot map and config epochs, and
        ``also`` holds.

        The limit is generous: after a primary is killed, an election the replicas lose
        on a loaded machine is retried only after four cluster-node-timeouts (8 s here).
        A timeout says which condition was still unmet.
        """
        unmet = ["nothing checked yet"]

        def stable() -> bool:
            maps, epochs = set(), set()
            for node in self._live():
                if "cluster_state:ok" not in node.call("CLUSTER", "INFO"):
                    unmet[0] = f"node {node.port} not cluster_state:ok"
                    return False
                reply = node.call("CLUSTER", "SLOTS")
                maps.add(tuple(sorted((int(e[0]), int(e[1]), int(e[2][1])) for e in reply)))
                epochs.add(self._epochs(node))
            if len(maps) != 1:
                unmet[0] = f"{len(maps)} different slot maps"
                return False
            if len(epochs) != 1:
                unmet[0] = "nodes disagree on config epochs"
                return False
            covered = sum(last - first + 1 for first, last, _ in next(iter(maps)))
            checks = (
                (covered == _SLOTS, f"{covered} slots covered"),
                (self._replicas_in_sync(), "replicas not in sync"),
                (also is None or also(), "the caller's condition"),
            )
            for met, what in checks:
                if not met:
                    unmet[0] = what
                    return False
            return True

        try:
            # Under a test's 60 s timeout, so that a failure says what was unmet.
            _wait(stable, "a stable cluster", limit=40.0)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc} (last unmet: {unmet[0]})") from None

    @staticmethod
    def _epochs(node: Node) -> frozenset[tuple[str, int]]:
        # (node id, config epoch) of every node this one does not flag as failing. A replica
        # wins an election only with its primary's current epoch: a cluster whose nodes still
        # disagree here can leave a shard unable to fail over.
        lines = node.call("CLUSTER", "NODES").splitlines()
        fields = (line.split() for line in lines)
        return frozenset((f[0], int(f[6])) for f in fields if "fail" not in f[2])

    def _replicas_in_sync(self) -> bool:
        # A replica still loading its first copy cannot acknowledge writes (WAIT): tests
        # that ask for acknowledgements start only once every replica streams.
        for node in self._live():
            info = node.call("INFO", "replication")
            if "role:slave" in info and (
                "master_link_status:up" not in info or "master_sync_in_progress:0" not in info
            ):
                return False
            if "role:master" in info and any(
                "state=online" not in line
                for line in info.splitlines()
                if line.startswith("slave") and ":" in line and "ip=" in line
            ):
                return False
        return True

    def close(self) -> None:
        for node in self.nodes:
            node.kill()


@contextlib.contextmanager
def redis_cluster(*, primaries: int = 3, replicas: int = 1) -> Iterator[ClusterHandle]:
    """A local cluster of ``primaries`` primaries with ``replicas`` replicas each."""
    executable = _executable()
    workdir = Path(tempfile.mkdtemp(prefix="aiolock-cluster-"))
    nodes: list[Node] = []
    try:
        for _ in range(primaries * (1 + replicas)):
            port = _free_port(bus=True)
            args = [
                "--port", str(port), "--bind", _HOST, "--dir", str(workdir),
                "--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
                "--cluster-config-file", f"nodes-{port}.conf",
                "--repl-diskless-sync-delay", "0", "--save", "", "--appendonly", "no",
            ]  # fmt: skip
            node = Node(executable, port, workdir, args)
            nodes.append(node)
            node.start()
        handle = ClusterHandle(nodes)
        # Distinct config epochs before the nodes meet, as `redis-cli --cluster create` sets
        # them. Left at 0, the nodes resolve the collision themselves, bumping one epoch at a
        # time; a primary killed before its replica heard its bump leaves that replica asking
        # for votes with a stale epoch, which every voter that heard it refuses for good.
        for epoch, node in enumerate(nodes, start=1):
            node.call("CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for node in nodes[1:]:
            nodes[0].call("CLUSTER", "MEET", _HOST, node.port)
        per = _SLOTS // primaries
        for index, node in enumerate(nodes[:primaries]):
            last = _SLOTS - 1 if index == primaries - 1 else (index + 1) * per - 1
            node.call("CLUSTER", "ADDSLOTSRANGE", index * per, last)
        ids = [node.call("CLUSTER", "MYID") for node in nodes[:primaries]]
        _wait(
            lambda: all(
                len(node.call("CLUSTER", "NODES").splitlines()) == len(nodes) for node in nodes
            ),
            "every node knowing every other",
        )
        for index, node in enumerate(nodes[primaries:]):
            node.call("CLUSTER", "REPLICATE", ids[index % primaries])
        handle.wait_stable(
            lambda: all(node.call("ROLE")[3] == "connected" for node in nodes[primaries:])
        )
        yield handle
    finally:
        for node in nodes:
            node.kill()
        shutil.rmtree(workdir, ignore_errors=True)


class SentinelHandle:
    """A running local Sentinel group."""

    def __init__(self, name: str, servers: list[Node], sentinels: list[Node]) -> None:
        self.master_name = name
        self.nodes = servers
        self.sentinels = sentinels
        self.sentinel_addresses = [(_HOST, node.port) for node in sentinels]

    def primary(self) -> Node:
        _, port = self.sentinels[0].call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)
        return next(node for node in self.nodes if node.port == int(port))

    def wait_settled(self) -> None:
        """Until every sentinel names one primary and every replica is connected to it."""

        def settled() -> bool:
            ports = {
                int(s.call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)[1])
                for s in self.sentinels
            }
            if len(ports) != 1:
                return False
            replicas = [node for node in self.nodes if node.port not in ports]
            return all(node.call("ROLE")[3] == "connected" for node in replicas)

        _wait(settled, "a settled group", 60.0)

    def failover(self) -> Node:
        """SENTINEL FAILOVER; return the new primary once every sentinel reports it."""
        old = self.primary()
        self.sentinels[0].call("SENTINEL", "FAILOVER", self.master_name)

        def switched() -> bool:
            ports = {
                int(s.call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)[1])
                for s in self.sentinels
            }
            return len(ports) == 1 and old.port not in ports

        _wait(switched, "every sentinel reporting the new primary")
        new = self.primary()
        _wait(lambda: new.call("ROLE")[0] == "master", "the new primary's role")
        return new


@contextlib.contextmanager
def redis_sentinel(
    *, replicas: int = 1, sentinels: int = 3, name: str = "mymaster"
) -> Iterator[SentinelHandle]:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels watching them."""
    executable = _executable()
    workdir = Path(tempfile.mkdtemp(prefix="aiolock-sentinel-"))
    servers: list[Node] = []
    watchers: list[Node] = []
    try:
        primary_port = _free_port()
        for index in range(1 + replicas):
            port = primary_port if index == 0 else _free_port()
            args = ["--port", str(port), "--bind", _HOST, "--dir", str(workdir), "--save", ""]
            if index:
                args += ["--replicaof", _HOST, str(primary_port)]
            node = Node(executable, port, workdir, args)
            servers.append(node)
            node.start()
        quorum = 2 if sentinels > 1 else 1
        for _ in range(sentinels):
            port = _free_port()
            conf = workdir / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind {_HOST}\ndir {workdir}\n"
                f"sentinel monitor {name} {_HOST} {primary_port} {quorum}\n"
                f"sentinel down-after-milliseconds {name} 1000\n"
                f"sentinel failover-timeout {name} 5000\n"
                f"sentinel parallel-syncs {name} 1\n"
            )
            node = Node(executable, port, workdir, [str(conf), "--sentinel"])
            watchers.append(node)
            node.start()
        handle = SentinelHandle(name, servers, watchers)

        def ready() -> bool:
            for watcher in watchers:
                if len(watcher.call("SENTINEL", "REPLICAS", name)) != replicas:
                    return False
                if len(watcher.call("SENTINEL", "SENTINELS", name)) != sentinels - 1:
                    return False
            return all(node.call("ROLE")[3] == "connected" for node in servers[1:])

        _wait(ready, "sentinels seeing the group", 60.0)
        yield handle
    finally:
        for node in watchers + servers:
            node.kill()
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def primary_and_replicas(replicas: int = 1) -> Iterator[list[Node]]:
    """A primary (first) and ``replicas`` replicas of it, no sentinel: nothing fails over."""
    executable = _executable()
    workdir = Path(tempfile.mkdtemp(prefix="aiolock-replicas-"))
    nodes: list[Node] = []
    try:
        primary_port = _free_port()
        for index in range(1 + replicas):
            port = primary_port if index == 0 else _free_port()
            args = ["--port", str(port), "--bind", _HOST, "--dir", str(workdir), "--save", ""]
            if index:
                args += ["--replicaof", _HOST, str(primary_port)]
            node = Node(executable, port, workdir, args)
            nodes.append(node)
            node.start()
        _wait(
            lambda: all(node.call("ROLE")[3] == "connected" for node in nodes[1:]),
            "replicas connected",
        )
        yield nodes
    finally:
        for node in nodes:
            node.kill()
        shutil.rmtree(workdir, ignore_errors=True)
