"""``python -m aiolock``: the admin command line (needs the extra ``aiolock[cli]``)."""

from __future__ import annotations

import sys

try:
    from aiolock.cli import main
except ImportError as exc:  # pragma: no cover - only without the extra
    sys.exit(f"aiolock: the command line needs the extra: pip install 'aiolock[cli]' ({exc})")

main()
