"""``--baseline REF``: an earlier aiolock, installed beside the current one for A/B in one run.

The package at git ref ``REF`` is extracted into a temporary folder as ``aiolock_baseline``
(its modules import each other relatively; the one absolute use of its own name, the
package resource lookup of its Lua files, is renamed), and the folder is put on
``sys.path`` of this process and, through ``AIOLOCK_BENCH_BASELINE``, of the processes the
multi-process case spawns. The adapter ``aiolock-baseline`` measures it exactly as
``aiolock`` is measured, interleaved with it.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

__all__ = ("ENV", "install_baseline", "on_path")

#: The folder holding ``aiolock_baseline``, for spawned processes.
ENV = "AIOLOCK_BENCH_BASELINE"
NAME = "aiolock_baseline"


def install_baseline(ref: str) -> tuple[Path, str]:
    """Extract ``aiolock/`` at ``ref`` as ``aiolock_baseline``; return its folder and commit."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", f"{ref}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "aiolock"],
        check=True,
        capture_output=True,
    ).stdout
    folder = Path(tempfile.mkdtemp(prefix="aiolock-baseline-"))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    package = folder / NAME
    (folder / "aiolock").rename(package)
    for module in package.glob("*.py"):
        text = module.read_text(encoding="utf-8")
        renamed = re.sub(r"""(files|import_module)\((["'])aiolock\2""", rf"\1(\2{NAME}\2", text)
        renamed = re.sub(r"^(from|import) aiolock\b", rf"\1 {NAME}", renamed, flags=re.M)
        if renamed != text:
            module.write_text(renamed, encoding="utf-8")
    os.environ[ENV] = str(folder)
    on_path()
    return folder, commit


def on_path() -> None:
    """Put the baseline's folder on ``sys.path`` if one was installed (spawned processes)."""
    folder = os.environ.get(ENV)
    if folder and folder not in sys.path:
        sys.path.insert(0, folder)
