"""The public surface: __all__, __version__, package data and the error tree."""

from __future__ import annotations

import hashlib
import importlib.metadata
import itertools
import re
from importlib import resources
from importlib.resources.abc import Traversable

import pytest

import aiolock
from aiolock._net.scripts import load_script

PACKAGE = resources.files("aiolock")


def shipped_lua() -> list[Traversable]:
    """Every .lua file in the installed package."""
    return sorted(
        (f for f in (PACKAGE / "_net" / "lua").iterdir() if f.name.endswith(".lua")),
        key=lambda f: f.name,
    )


def referenced_scripts() -> set[str]:
    """Names of the scripts the installed package's code loads: ``load_script("...")``, or
    named by a primitive's ``<step>_script = "..."`` attribute."""
    names: set[str] = set()
    pattern = r"(?:load_script\(\s*|\b\w+_script = )\"(\w+)\""
    folders = [PACKAGE]
    while folders:
        for entry in folders.pop().iterdir():
            if entry.is_dir():
                folders.append(entry)
            elif entry.name.endswith(".py"):
                names.update(re.findall(pattern, entry.read_text("utf-8")))
    return names


def test_all_is_sorted_tuple() -> None:
    """aiolock.__all__ is a tuple of unique names in sorted order."""
    assert isinstance(aiolock.__all__, tuple)
    assert list(aiolock.__all__) == sorted(aiolock.__all__)
    assert len(set(aiolock.__all__)) == len(aiolock.__all__)


@pytest.mark.parametrize("name", aiolock.__all__)
def test_all_names_exist_in_aiolock(name: str) -> None:
    """Every name in __all__ exists and says it lives in `aiolock` (as tracebacks show it)."""
    obj = getattr(aiolock, name)
    assert obj.__module__ == "aiolock"
    assert obj.__name__ == name
    assert obj.__doc__


def test_version_matches_metadata() -> None:
    """aiolock.__version__ is the installed distribution's version."""
    assert aiolock.__version__ == importlib.metadata.version("aiolock")


def test_unknown_attribute() -> None:
    """A missing attribute of the package raises AttributeError naming it."""
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = aiolock.no_such_name  # type: ignore[attr-defined]


def test_py_typed_shipped() -> None:
    """The installed package carries the py.typed marker."""
    assert (PACKAGE / "py.typed").is_file()


def test_referenced_scripts_are_shipped() -> None:
    """Every script the code loads is a .lua file of the installed package."""
    referenced = referenced_scripts()
    assert "lock_acquire" in referenced
    shipped = {f.name.removesuffix(".lua") for f in shipped_lua()}
    assert referenced <= shipped, f"missing from the package: {referenced - shipped}"


@pytest.mark.parametrize("script", sorted(referenced_scripts()))
def test_script_loads(script: str) -> None:
    """load_script() reads each referenced script; its SHA-1 is the text's."""
    loaded = load_script(script)
    assert loaded.name == script
    assert loaded.text.strip()
    assert loaded.sha == hashlib.sha1(loaded.text.encode()).hexdigest()


@pytest.mark.parametrize("lua", shipped_lua(), ids=lambda f: f.name)
def test_lua_header(lua: Traversable) -> None:
    """Each .lua file starts with a comment header describing its KEYS and ARGV."""
    text = lua.read_text("utf-8")
    assert text.startswith("--")
    header = "\n".join(itertools.takewhile(lambda line: line.startswith("--"), text.splitlines()))
    assert re.search(r"KEYS\[", header), "header does not describe KEYS"
    assert re.search(r"ARGV\[", header), "header does not describe ARGV"


ERRORS = [
    aiolock.ClientClosedError,
    aiolock.LockLostError,
    aiolock.LockNotOwnedError,
    aiolock.LockTimeoutError,
    aiolock.LockUpgradeError,
    aiolock.ReleaseError,
    aiolock.ReplicaAckError,
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.__name__)
def test_errors_subclass_lock_error(error: type[Exception]) -> None:
    """Every aiolock error is a LockError."""
    assert issubclass(error, aiolock.LockError)


def test_every_public_error_is_in_the_tree() -> None:
    """Every exception class in __all__ is LockError or one of its subclasses."""
    public = [getattr(aiolock, n) for n in aiolock.__all__]
    errors = [o for o in public if isinstance(o, type) and issubclass(o, BaseException)]
    assert set(errors) == {aiolock.LockError, *ERRORS}
    assert issubclass(aiolock.LockError, Exception)


def test_lock_timeout_error_is_timeout_error() -> None:
    """LockTimeoutError is also a TimeoutError, so `except TimeoutError` catches it."""
    assert issubclass(aiolock.LockTimeoutError, TimeoutError)
    error = aiolock.LockTimeoutError("orders", 5)
    assert "orders" in str(error)
    with pytest.raises(TimeoutError):
        raise error


def test_error_messages_name_lock_and_holder() -> None:
    """Error messages name the lock and, where there is one, the holder id."""
    assert "'orders'" in str(aiolock.LockNotOwnedError("orders", "uuid:1"))
    assert "uuid:1" in str(aiolock.LockNotOwnedError("orders", "uuid:1"))
    lost = aiolock.LockLostError("orders", "uuid:1", "force_unlock() deleted it")
    assert "'orders'" in str(lost)
    assert "uuid:1" in str(lost)
    assert "force_unlock() deleted it" in str(lost)
    assert "closed" in str(aiolock.ClientClosedError())


def test_every_lock_kind_is_guardable() -> None:
    """guarded() is on every lock kind, MultiLock and RedLock; aiolock.Hold is public."""
    kinds = (
        aiolock.Lock,
        aiolock.FairLock,
        aiolock.ReadLock,
        aiolock.WriteLock,
        aiolock.FairReadLock,
        aiolock.FairWriteLock,
        aiolock.FencedLock,
        aiolock.SpinLock,
        aiolock.MultiLock,
        aiolock.RedLock,
    )
    for kind in kinds:
        assert callable(kind.guarded), kind
    assert "Hold" in aiolock.__all__
