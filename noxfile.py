"""Developer and CI sessions: ``nox`` runs tests, lint and mypy; ``nox -s faults`` the fault
suite; ``nox -s bench`` benchmarks.

Tests run against a wheel installed non-editable, so a file missing from the wheel (a Lua
script, py.typed) fails them. Reuse a prebuilt wheel with
``nox -s tests -- --installpkg dist/aiolock-X-py3-none-any.whl [pytest args]``.

``tests`` runs once per Python of the classifiers in pyproject.toml (``tests-3.11``,
``tests-3.12``, ...) with the newest redis-py the package accepts. ``compat`` runs them on
the oldest Python with the lowest redis-py and hiredis the package accepts, and with
aiolock's public-API fallback wire (``AIOLOCK_WIRE=redis-py``) on the lowest and the highest.
``faults`` runs on the oldest Python with the lowest redis-py and on the newest with the
highest. ``nox -s tests-3.12`` picks one session; ``nox -l`` lists them. An interpreter nox
cannot find is skipped with a warning, except where ``CI`` is set or
``--error-on-missing-interpreters`` is given: then it fails the run. lint, mypy and bench
run on the Python that runs nox.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"  # nox.project.dependency_groups
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests", "lint", "mypy"]

PYPROJECT = nox.project.load_toml("pyproject.toml")
LINTED = ["aiolock", "tests", "benchmarks", "examples", "noxfile.py"]
# "Programming Language :: Python :: 3.X" classifiers, oldest first.
PYTHONS = nox.project.python_versions(PYPROJECT)


def _install_wheel(session: nox.Session, *groups: str) -> list[str]:
    """Install the project's wheel and the given dependency groups; return the other posargs."""
    args = list(session.posargs)
    if "--installpkg" in args:
        at = args.index("--installpkg")
        wheel = args[at + 1]
        del args[at : at + 2]
    else:
        dist = Path(session.create_tmp()) / "dist"
        shutil.rmtree(dist, ignore_errors=True)
        session.run("python", "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), ".")
        (built,) = dist.glob("aiolock-*.whl")
        wheel = str(built)
    session.install(wheel, *nox.project.dependency_groups(PYPROJECT, *groups))
    return args


# Two pytest-xdist workers, each with its own servers: the suite waits on the servers as
# much as it computes, so two workers on two cores take half the time (4.2 -> 2.2 min).
PARALLEL = ["-n", "2"]


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Run pytest against the installed wheel; pass pytest arguments after ``--``."""
    pytest_args = _install_wheel(session, "tests")
    # nox fails on any non-zero exit, so pytest's 5 ("no tests collected") fails too.
    session.run("pytest", *PARALLEL, *pytest_args)


def _lowest(*names: str) -> list[str]:
    """Exact pins of the lower bounds the package declares for ``names`` (``X>=1`` -> ``X==1``)."""
    pins = []
    for requirement in PYPROJECT["project"]["dependencies"]:
        name, _, bounds = requirement.partition(">=")
        if name.split("[")[0].strip() in names:
            pins.append(f"{name.strip()}=={bounds.split(',')[0].strip()}")
    if len(pins) != len(names):
        raise LookupError(f"no lower bound for all of {names} in pyproject.toml")
    return pins


def _install_redis_py(session: nox.Session, redis_py: str) -> None:
    """Pin redis-py and hiredis to their lowest accepted releases, or keep the highest."""
    if redis_py == "lowest":
        session.install(*_lowest("redis", "hiredis"))
    session.run(
        "python",
        "-c",
        "import redis, hiredis; print('redis-py', redis.__version__, "
        "'hiredis', hiredis.__version__)",
    )


@nox.session(python=PYTHONS[0])
@nox.parametrize(
    ("redis_py", "wire"),
    [("lowest", "direct"), ("lowest", "redis-py"), ("highest", "redis-py")],
)
def compat(session: nox.Session, redis_py: str, wire: str) -> None:
    """The test suite on the oldest Python with the lowest or highest redis-py, and on
    aiolock's public-API fallback wire (the highest with the direct wire is ``tests``)."""
    pytest_args = _install_wheel(session, "tests")
    _install_redis_py(session, redis_py)
    session.run("pytest", *PARALLEL, *pytest_args, env={"AIOLOCK_WIRE": wire})


@nox.session
@nox.parametrize(("python", "redis_py"), [(PYTHONS[0], "lowest"), (PYTHONS[-1], "highest")])
def faults(session: nox.Session, redis_py: str) -> None:
    """The fault-injection suite (tests/faults), the full cancellation sweep (one server and
    cluster, and with every error reply) and the misuse tests; one line per scenario. On the
    oldest Python with the lowest redis-py, and on the newest with the highest.

    ``AIOLOCK_FULL_SWEEP=0`` leaves the full sweep out (CI's run on a second server: the
    sweep checks the client's cancellation paths, which do not depend on the server, and
    that server still gets the quick sweep with the test suite).
    """
    pytest_args = _install_wheel(session, "tests")
    _install_redis_py(session, redis_py)
    # The scenarios alone: their workers' load and figures must not share the cores.
    session.run("pytest", "--faults", "tests/faults", *pytest_args)
    sweeps = ["tests/test_cancel_sweep.py", "tests/test_cluster_cancel_sweep.py"]
    if redis_py == "lowest":
        # Every refusal (BUSY, TRYAGAIN, ...) at every call site, swept: once, with the
        # lowest redis-py, whose classing of error replies differs most (the client's
        # handling of them does not depend on the Python); the tests run its share.
        sweeps.append("tests/test_error_replies.py")
    if os.environ.get("AIOLOCK_FULL_SWEEP", "1") == "0":
        sweeps = []
    session.run(
        "pytest",
        *PARALLEL,
        "--faults",
        *sweeps,
        "tests/test_misuse.py",
        "tests/test_validation.py",
        "tests/test_lost_messages.py",
        *pytest_args,
    )


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff lint and format check."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", *LINTED)
    session.run("ruff", "format", "--check", *LINTED)


@nox.session
def mypy(session: nox.Session) -> None:
    """mypy --strict over aiolock, tests, benchmarks and examples (configured in pyproject.toml)."""
    mypy_args = _install_wheel(session, "typing")
    session.run("mypy", *mypy_args)


@nox.session
def bench(session: nox.Session) -> None:
    """Run the benchmarks against the installed wheel; arguments after ``--`` go to them."""
    bench_args = _install_wheel(session, "bench")
    session.run("python", "-m", "benchmarks", *bench_args)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site with ``mkdocs build --strict`` (into ``site/``, or the
    directory given after ``--``) and type-check its examples with ``mypy --strict``; the
    test suite runs them (tests/test_docs_examples.py)."""
    args = _install_wheel(session, "docs")
    session.run("python", "-m", "tests.docs_examples", "--mypy")
    # Material's notice about its own end of life is printed on every build: not ours.
    session.run(
        "mkdocs",
        "build",
        "--strict",
        "--site-dir",
        *(args or ["site"]),
        env={"NO_MKDOCS_2_WARNING": "1"},
    )
