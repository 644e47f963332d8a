"""mkdocs hook: publish the committed benchmark plots (benchmarks/results/*.png) with the site.

The benchmarks page includes benchmarks/results/results.md with pymdownx.snippets; the
plots it shows live beside it, outside docs/, and are added here as generated files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def on_files(files: Files, config: Any) -> Files:
    """Add each plot as ``benchmarks/<name>.png`` of the site."""
    for plot in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"benchmarks/{plot.name}", abs_src_path=str(plot)))
    return files
