"""A ``Store`` from what ``ProcQueue(store=...)`` was given: a ``Store``, a
path or ``sqlite:///path`` (SQLite), or ``postgresql://...`` (PostgreSQL).

The caller's side of the store interface: it picks the implementation, so that
``_stores.base`` never imports its own subclasses.
"""

from __future__ import annotations

import os

from procq._stores.base import Store, StoreError

__all__ = ["open_store"]


def open_store(spec: str | os.PathLike[str] | Store) -> Store:
    """A ``Store`` from ``ProcQueue(store=...)``: a ``Store``, a path or
    ``sqlite:///path`` (SQLite), or ``postgresql://...`` (PostgreSQL)."""
    if isinstance(spec, Store):
        return spec
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise TypeError(f"store must be a path, a URL or a procq Store, got {type(spec).__name__}")
    if spec.startswith(("postgresql://", "postgres://")):
        from procq._stores.postgres import PostgresStore

        return PostgresStore(spec)
    from procq._stores.sqlite import SqliteStore

    if spec.startswith("sqlite://"):
        path = spec[len("sqlite://") :]
        if not path.startswith("/"):
            raise StoreError(f"a SQLite URL is sqlite:///relative/path or sqlite:////absolute/path, got {spec!r}")
        return SqliteStore(path[1:])
    if "://" in spec:
        raise StoreError(f"store {spec!r}: the URL schemes are sqlite:/// and postgresql://")
    return SqliteStore(spec)
