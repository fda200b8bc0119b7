"""The store's costs, beside the in-memory queue, in one run on one machine:
``python -m bench.store [--no-postgres]``.

- tiny: jobs/s for n tiny jobs (push each, then wait for all), in memory, on
  a SQLite file, on PostgreSQL (a throwaway server started here), round by
  round; and the floors of a store's push: the in-memory queue with, before
  each push, the least a push on a store must do (one read of the key's row
  on a SQLite file, and then also each job's row written and committed in
  batches; one round trip to the PostgreSQL server reading the row);
- cached: pushes/s of keys that completed earlier, from a fresh process;
- joiner: how long after a job's end a joiner in another process is told
  (median and p90 over rounds), SQLite (it polls every 10 ms) and PostgreSQL
  (LISTEN/NOTIFY);
- programs: several programs (``--programs``, 4) pushing tiny jobs on one
  SQLite file for ``--seconds`` (15): the worst wait for an outcome, and the
  jobs done (``bench.store_programs``). ``--only-programs`` runs this alone.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import pickle
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench.store_jobs import noop, stamp_when_released
from bench.store_programs import programs
from procq import Job, Lane, ProcQueue, SqliteStore

_runs = itertools.count()


def tiny(store: Any, n: int, read: Callable[[str], Any] | None = None) -> float:
    """Jobs/s of ``n`` tiny jobs pushed one by one, then waited for. ``read``:
    called with each key before its push (a queue in memory with it is a floor)."""
    with ProcQueue({"t": Lane(workers=2, capacity=n)}, store=store) as q:
        for i in range(50):
            q.push_and_wait(Job(f"w{i}", noop))
        run = next(_runs)
        keys = [f"tiny-{run}-{i}" for i in range(n)]
        t0 = time.perf_counter()
        if read is None:
            handles = [q.push(Job(k, noop)).handle for k in keys]  # type: ignore[union-attr]
        else:
            handles = [read(k) or q.push(Job(k, noop)).handle for k in keys]  # type: ignore[union-attr]
        for h in handles:
            h.result()
        return n / (time.perf_counter() - t0)


@contextlib.contextmanager
def sqlite_read(path: str) -> Iterator[Callable[[str], Any]]:
    """The least a push on a SQLite store does: read its key's row (here, none)."""
    conn = SqliteStore(path).connect()  # (the store's schema: a read of its real table)
    try:
        yield lambda key: conn.db.execute("SELECT 1 FROM procq_keys WHERE key = ?", (key,)).fetchone()
    finally:
        conn.close()


@contextlib.contextmanager
def sqlite_read_write(path: str) -> Iterator[Callable[[str], Any]]:
    """The least a push on a SQLite store does, and the least its job's row
    costs: one read a push, and every 2 ms (procq's group window) the rows
    of the keys read since written in one statement and committed, by a
    thread of their own on a connection of its own (as procq's committer)."""
    reads, writes = SqliteStore(path).connect(), SqliteStore(path).connect()
    output = pickle.dumps(None)
    rows: list[tuple[Any, ...]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def write() -> None:
        while not stop.wait(0.002):
            with lock:
                batch = rows[:]
                rows.clear()
            if batch:
                writes.db.execute("BEGIN IMMEDIATE")
                for i in range(0, len(batch), 256):  # (SQLite binds at most 32,766 values a statement)
                    chunk = batch[i : i + 256]
                    marks = ", ".join(["(" + ", ".join("?" * 12) + ")"] * len(chunk))
                    writes.db.execute(f"INSERT INTO procq_keys VALUES {marks}", [v for row in chunk for v in row])
                writes.db.execute("COMMIT")

    def read_write(key: str) -> None:
        reads.db.execute("SELECT 1 FROM procq_keys WHERE key = ?", (key,)).fetchone()
        now = time.time()
        with lock:
            rows.append((key, "done", key, None, b"0123456789abcdef", output, "pickle", None, 1, None, now, now))

    writer = threading.Thread(target=write, name="floor-writer")
    writer.start()
    try:
        yield read_write
    finally:
        stop.set()
        writer.join()
        reads.close()
        writes.close()


@contextlib.contextmanager
def postgres_read(url: str) -> Iterator[Callable[[str], Any]]:
    """The least a push on a PostgreSQL store does: one round trip, reading its key's row."""
    from procq import PostgresStore  # (psycopg: only where PostgreSQL is benched)

    conn = PostgresStore(url).connect()
    cur = conn.raw().cursor(binary=True)
    try:
        yield lambda key: cur.execute("SELECT 1 FROM procq_keys WHERE key = %s", (key,), prepare=True).fetchone()
    finally:
        conn.close()


_CACHED = """
import sys, time
from bench.store_jobs import noop
from procq import Job, ProcQueue
n = int(sys.argv[2])
with ProcQueue(1, store=sys.argv[1]) as q:
    jobs = [Job(f"c{i}", noop) for i in range(n)]
    t0 = time.perf_counter()
    for job in jobs:
        q.push(job)
    print(n / (time.perf_counter() - t0))
"""


def cached(url: str, n: int) -> float:
    with ProcQueue({"t": Lane(workers=2, capacity=n)}, store=url) as q:
        for h in [q.push(Job(f"c{i}", noop)).handle for i in range(n)]:  # type: ignore[union-attr]
            h.result()
    out = subprocess.run([sys.executable, "-c", _CACHED, url, str(n)], capture_output=True, text=True, check=True)
    return float(out.stdout)


_JOINER = """
import sys, time
from bench.store_jobs import stamp_when_released
from procq import Job, ProcQueue
with ProcQueue(1, store=sys.argv[1]) as q:
    for line in sys.stdin:
        key, fifo = line.split()
        handle = q.push(Job(key, stamp_when_released, args=(fifo,))).handle
        handle.done()
        q._core.wait_event(handle._entry)  # watched from now on
        print("joined", flush=True)
        ended = handle.result(timeout=30)
        print((time.time() - ended) * 1e3, flush=True)
"""


def joiner(url: str, rounds: int) -> tuple[float, float]:
    """Median and p90 (ms) from a job's end to a joiner in another process being told."""
    tmp = tempfile.mkdtemp()
    lags = []
    proc = subprocess.Popen(
        [sys.executable, "-c", _JOINER, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        with ProcQueue(1, store=url) as q:
            try:
                for i in range(rounds):
                    fifo = os.path.join(tmp, f"go{i}")
                    os.mkfifo(fifo)
                    handle = q.push(Job(f"lat{i}", stamp_when_released, args=(fifo,))).handle  # type: ignore[union-attr]
                    proc.stdin.write(f"lat{i} {fifo}\n")
                    proc.stdin.flush()
                    joined = proc.stdout.readline()
                    if joined != "joined\n":
                        raise RuntimeError(f"the joiner process did not join (it said {joined!r}; its stderr says why)")
                    fd = os.open(fifo, os.O_WRONLY)
                    os.write(fd, b"x")
                    os.close(fd)
                    handle.result(timeout=30)
                    lags.append(float(proc.stdout.readline()))
            except BaseException:
                q.close(wait=False)  # its job waits on a FIFO no one will open: a close that waited never returns
                raise
        proc.stdin.close()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    lags.sort()
    return statistics.median(lags), lags[int(len(lags) * 0.9)]


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL server (as the tests start one); yields a database URL."""
    root = tempfile.mkdtemp(prefix="procq-bench-pg-")
    data = os.path.join(root, "data")
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if prefix:
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
    started = False
    try:
        subprocess.run(
            [*prefix, "initdb", "-D", data, "-U", "postgres", "-A", "trust"], check=True, capture_output=True
        )
        opts = f"-c listen_addresses='' -c unix_socket_directories={root}"
        log = os.path.join(root, "log")
        subprocess.run(
            [*prefix, "pg_ctl", "-D", data, "-o", opts, "-l", log, "-w", "start"], check=True, capture_output=True
        )
        started = True
        yield f"postgresql:///postgres?host={root}&user=postgres"
    finally:
        if started:
            subprocess.run([*prefix, "pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def _pg_available() -> bool:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return False
    return shutil.which("initdb") is not None and shutil.which("pg_ctl") is not None


def _median(fn: Any, rounds: int) -> float:
    return float(statistics.median(fn() for _ in range(rounds)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--no-postgres", action="store_true", help="skip PostgreSQL (run when initdb, pg_ctl and psycopg are here)"
    )
    parser.add_argument("--tiny", type=int, default=5000)
    parser.add_argument("--cached", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=30, help="joiner samples")
    parser.add_argument("--repeat", type=int, default=3, help="runs of tiny and cached; the median is kept")
    parser.add_argument("--programs", type=int, default=4, help="programs sharing one SQLite file")
    parser.add_argument("--seconds", type=float, default=15.0, help="how long those programs push")
    parser.add_argument("--only-programs", action="store_true", help="run only the programs workload")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="procq-bench-")
    n = itertools.count()
    rows: list[tuple[str, ...]] = []

    def fresh_db() -> str:
        return os.path.join(tmp, f"s{next(n)}.db")

    pg_url = None
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        if not args.no_postgres and not args.only_programs and _pg_available():
            pg_url = stack.enter_context(postgres())
        if not args.only_programs:
            _run(args, fresh_db, pg_url, rows)
        _programs(args, fresh_db(), rows)
        print()
        print("| measure | in memory | store | target |")
        print("|---|---:|---:|---|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        print(f"\nload average (1 min) at end: {os.getloadavg()[0]:.2f}")


def _tiny_rounds(args: argparse.Namespace, fresh_db: Callable[[], str], pg_url: str | None) -> dict[str, float]:
    """Medians of the tiny runs, interleaved round by round so that the host's
    drift hits every store and floor alike."""
    runs: dict[str, list[float]] = {}

    def add(name: str, rate: float) -> None:
        runs.setdefault(name, []).append(rate)

    for _ in range(args.repeat):
        add("memory", tiny(None, args.tiny))
        add("sqlite", tiny(fresh_db(), args.tiny))
        with sqlite_read(fresh_db()) as read:
            add("sqlite floor", tiny(None, args.tiny, read))
        with sqlite_read_write(fresh_db()) as read:
            add("sqlite floor, rows", tiny(None, args.tiny, read))
        if pg_url is not None:
            add("postgres", tiny(pg_url, args.tiny))
            with postgres_read(pg_url) as read:
                add("postgres floor", tiny(None, args.tiny, read))
    return {name: statistics.median(rates) for name, rates in runs.items()}


def _run(
    args: argparse.Namespace, fresh_db: Callable[[], str], pg_url: str | None, rows: list[tuple[str, ...]]
) -> None:
    tinies = _tiny_rounds(args, fresh_db, pg_url)
    memory = tinies["memory"]

    def tiny_row(name: str, label: str, target: str) -> None:
        rate = tinies[name]
        print(f"{label}: {rate:,.0f} jobs/s ({rate / memory:.2f}x)")
        rows.append((label, f"{memory:,.0f}", f"{rate:,.0f} ({rate / memory:.2f}x)", target))

    print(f"tiny jobs/s, in memory: {memory:,.0f}")
    tiny_row("sqlite", "tiny jobs/s (push each, wait all)", "0.5x")
    tiny_row("sqlite floor", "floor: in memory + one SQLite read a push", "")
    tiny_row("sqlite floor, rows", "floor: ... + each job's row, written and committed every 2 ms", "")
    cached_lite = _median(lambda: cached(fresh_db(), args.cached), args.repeat)
    print(f"cached, SQLite, fresh process: {cached_lite:,.0f} pushes/s")
    rows.append(("cached pushes/s, fresh process", "", f"{cached_lite:,.0f}", ">= 50,000"))
    med, p90 = joiner(fresh_db(), args.rounds)
    print(f"joiner, SQLite:   median {med:.1f} ms, p90 {p90:.1f} ms")
    rows.append(("joiner in another process told (median, p90)", "", f"{med:.1f} ms, {p90:.1f} ms", "50 ms"))
    if pg_url is None:
        return
    tiny_row("postgres", "tiny jobs/s, PostgreSQL", "0.25x")
    tiny_row("postgres floor", "floor: in memory + one PostgreSQL round trip a push", "")
    cached_pg = cached(pg_url, args.cached)
    print(f"cached, PostgreSQL, fresh process: {cached_pg:,.0f} pushes/s")
    rows.append(("cached pushes/s, PostgreSQL", "", f"{cached_pg:,.0f}", ""))
    med, p90 = joiner(pg_url, args.rounds)
    print(f"joiner, PostgreSQL: median {med:.1f} ms, p90 {p90:.1f} ms")
    rows.append(("joiner told, PostgreSQL (median, p90)", "", f"{med:.1f} ms, {p90:.1f} ms", "10 ms"))


def _programs(args: argparse.Namespace, path: str, rows: list[tuple[str, ...]]) -> None:
    found = programs(path, args.programs, args.seconds)
    each = ", ".join(f"{n:,}" for n in found["each"])
    print(
        f"{args.programs} programs on one SQLite file, {args.seconds:g} s: {found['jobs']:,} jobs ({each}); "
        f"wait for an outcome: worst {found['worst']:.3f} s, p99 {found['p99'] * 1e3:.0f} ms; "
        f"job's end to its handle done: worst {found['commit_worst'] * 1e3:.0f} ms, "
        f"p99 {found['commit_p99'] * 1e3:.0f} ms"
    )
    label = f"{args.programs} programs on one SQLite file, {args.seconds:g} s"
    waits = f"{found['worst']:.2f} s ({found['p99'] * 1e3:.0f} ms), {found['jobs']:,}"
    commits = f"{found['commit_worst'] * 1e3:.0f} ms ({found['commit_p99'] * 1e3:.0f} ms)"
    rows.append((f"{label}: worst wait (p99), jobs", "", waits, "none over 1 s"))
    rows.append(("... a job's end to its handle done (its row committed): worst (p99)", "", commits, "tens of ms"))


if __name__ == "__main__":
    main()
