"""aiolock's benchmark suite: ``python -m benchmarks`` (see README.md)."""
