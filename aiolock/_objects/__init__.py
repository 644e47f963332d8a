"""The lock objects: one module per object or handle kind, each a thin face over the engine."""
