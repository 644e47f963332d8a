"""The engine: acquire, release, counting, waiting, holds, renewal and the guard."""
