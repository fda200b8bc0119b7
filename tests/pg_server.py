"""A throwaway PostgreSQL server for the store tests (filled in with the PostgreSQL store)."""

from __future__ import annotations

import pytest

PG_SKIP: str | None = "the PostgreSQL store is not built yet"


def pg_url(request: pytest.FixtureRequest) -> str:
    raise NotImplementedError
