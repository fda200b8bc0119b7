"""A throwaway PostgreSQL server for the store tests, started by the tests themselves.

``initdb`` and ``pg_ctl`` run in a temporary directory (as the ``postgres``
user when the tests run as root), and the server listens on a unix socket in
that directory only. Each test gets a database of its own. Without the binaries
or psycopg the PostgreSQL tests are skipped, saying why; in CI (``CI=true``)
they fail instead, so a CI run cannot pass without them.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def _missing() -> str | None:
    for tool in ("initdb", "pg_ctl"):
        if shutil.which(tool) is None:
            return f"PostgreSQL is not installed here ({tool} is not on PATH)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'procq[postgres]')"
    return None


#: Why the PostgreSQL tests cannot run here, or None.
PG_SKIP = _missing()
_REQUIRED = os.environ.get("CI") == "true"
_dbs = itertools.count(1)


def _as_postgres() -> list[str]:
    """The prefix that runs a command as a user PostgreSQL accepts (not root)."""
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", "postgres", "--"]


class PgServer:
    """One throwaway server: ``initdb`` in a temporary directory, listening on
    a unix socket there only. ``stop()`` and ``start()`` may be called again
    (a test of a store whose server goes away); ``remove()`` ends it for good."""

    def __init__(self) -> None:
        self.root = tempfile.mkdtemp(prefix="procq-pg-")
        self.data = os.path.join(self.root, "data")
        self.prefix = _as_postgres()
        self.running = False
        if self.prefix:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        subprocess.run([*self.prefix, "initdb", "-D", self.data, "-U", "postgres", "-A", "trust"],
                       check=True, capture_output=True, timeout=120)  # fmt: skip

    def url(self, db: str = "postgres") -> str:
        return f"postgresql:///{db}?host={self.root}&user=postgres"

    def start(self) -> None:
        options = f"-c listen_addresses='' -c unix_socket_directories={self.root} -c fsync=off -c max_connections=200"
        log = os.path.join(self.root, "log")
        subprocess.run([*self.prefix, "pg_ctl", "-D", self.data, "-o", options, "-l", log, "-w", "start"],
                       check=True, capture_output=True, timeout=120)  # fmt: skip
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        subprocess.run([*self.prefix, "pg_ctl", "-D", self.data, "-m", mode, "-w", "stop"],
                       check=True, capture_output=True, timeout=120)  # fmt: skip
        self.running = False

    def remove(self) -> None:
        try:
            if self.running:
                self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def require_pg() -> None:
    """Skip the calling test when PostgreSQL cannot run here (fail instead in CI)."""
    if PG_SKIP:
        if _REQUIRED:
            pytest.fail(f"the PostgreSQL tests must run in CI: {PG_SKIP}")
        pytest.skip(PG_SKIP)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """Start a server for the session; yields its socket directory. Stopped (and its files removed) at the end."""
    server = PgServer()
    try:
        server.start()
        yield server.root
    finally:
        server.remove()


@pytest.fixture
def own_pg_server() -> Iterator[PgServer]:
    """A server of the test's own, started; the test may stop and start it."""
    require_pg()
    server = PgServer()
    try:
        server.start()
        yield server
    finally:
        server.remove()


def pg_url(request: pytest.FixtureRequest) -> str:
    """A fresh database on the session's server, as a ``postgresql://`` URL."""
    require_pg()
    import psycopg

    root = request.getfixturevalue("pg_server")
    name = f"t{os.getpid()}_{next(_dbs)}"
    with psycopg.connect(f"postgresql:///postgres?host={root}&user=postgres", autocommit=True) as con:
        con.execute(f"CREATE DATABASE {name}")
    return f"postgresql:///{name}?host={root}&user=postgres"


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store's URL: a SQLite file in the test's directory, then a
    database of its own on the session's PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'run.db'}"
    return pg_url(request)
