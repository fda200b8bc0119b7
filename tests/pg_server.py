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


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """Start a server for the session; yields its socket directory. Stopped (and its files removed) at the end."""
    root = tempfile.mkdtemp(prefix="procq-pg-")
    data = os.path.join(root, "data")
    prefix = _as_postgres()
    if prefix:
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
    started = False
    try:
        subprocess.run([*prefix, "initdb", "-D", data, "-U", "postgres", "-A", "trust"],
                       check=True, capture_output=True, timeout=120)  # fmt: skip
        options = f"-c listen_addresses='' -c unix_socket_directories={root} -c fsync=off -c max_connections=200"
        subprocess.run([*prefix, "pg_ctl", "-D", data, "-o", options, "-l", os.path.join(root, "log"), "-w", "start"],
                       check=True, capture_output=True, timeout=120)  # fmt: skip
        started = True
        yield root
    finally:
        if started:
            subprocess.run([*prefix, "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"],
                           capture_output=True, timeout=120)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def pg_url(request: pytest.FixtureRequest) -> str:
    """A fresh database on the session's server, as a ``postgresql://`` URL."""
    if PG_SKIP:
        if _REQUIRED:
            pytest.fail(f"the PostgreSQL tests must run in CI: {PG_SKIP}")
        pytest.skip(PG_SKIP)
    import psycopg

    root = request.getfixturevalue("pg_server")
    name = f"t{os.getpid()}_{next(_dbs)}"
    with psycopg.connect(f"postgresql:///postgres?host={root}&user=postgres", autocommit=True) as con:
        con.execute(f"CREATE DATABASE {name}")
    return f"postgresql:///{name}?host={root}&user=postgres"
