"""Named read questions over the store, one function each, for ``reports/``.

Each takes a ``Store`` and plain values, and returns rows or a table whose
columns are documented on the function. This is the only place besides
``core`` where SQL is written.
"""

from __future__ import annotations

__all__: list[str] = []
