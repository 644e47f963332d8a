"""aiolock's admin command line (``aiolock`` / ``python -m aiolock``; extra ``aiolock[cli]``).

Imported only by those entry points: ``import aiolock`` never imports click or rich.
"""

from __future__ import annotations

from ._commands import cli, main

__all__ = ("cli", "main")
