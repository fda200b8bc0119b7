"""How a queue on a store makes its writes durable before anyone hears of
them: ``Commits`` (the writes waiting, and the wake-ups held back for them)
and ``Committer``, the thread that commits them.

Two kinds of write reach a queue's database connection:

- **claims**, made by the pushing thread itself inside a *group transaction*
  that stays open across pushes (``StoreCore.claim``). A claim needs no
  commit before its push returns: nothing has been answered from it, and if
  the process dies first the claim dies with it, as if the push came later.
  Where the transaction's lock holds every key (SQLite: ``Store.defers_claims``),
  a key with no row is claimed by a read and a queued write (``Fresh``) made
  with the group's other writes, in one statement; and a job that ended
  before its claim was written has one row written, its ended one.
  The committer commits the group transaction ``GROUP_WINDOW`` after it
  opened, never later, so other processes wait no longer than that for a
  key it holds (and, on SQLite, for the file's one write lock);
- **outcomes** (a job's ended row) and **restores** (a claim given back),
  queued by the state map's record operations under ``Core.lock`` as
  ``Write``s (``Commits.add``). The supervisor's thread never runs a
  statement: the committer runs the queued writes in the group transaction,
  commits, and only then runs the wake-ups those outcomes released. With no
  group open, it commits outcomes at most every ``GROUP_WINDOW`` after the
  last commit, or every twice the time the last commit's own work took where
  commits wait for a disk (at most ``PACE_LIMIT``): a stream of outcomes
  shares commits, and the pushing threads keep the connection most of the
  time.

Pacing never feeds on itself: what a commit waited for before it held the
database's lock (another program's transaction) is not its work, and does
not space the next commit further; and an open group transaction, which
holds that lock, is never kept open for pacing. (Counting the wait once made
each wait for another program lengthen this program's next hold of the lock,
which lengthened the other programs' waits in turn: with a few programs on
one SQLite file, outcomes waited seconds to be committed.)

The committer, not the pushing thread, runs the group's writes: the database
does their work with the GIL released (``sqlite3`` and ``psycopg`` both let it
go while a statement runs), so it overlaps the pushes' own Python.

Wake-ups are held back by sequence: every write takes the next number; a
wake-up delivered while writes up to number N are not yet committed waits
for N (``Commits.hold``) and runs right after the commit that reaches N. So a
waiter is never told of an outcome before its row is durable, and a steady
stream of new writes never holds back an older wake-up.

A write the store refuses (it is gone, read-only, full) stays queued, with its
wake-ups, and is tried again every ``RETRY`` seconds until it commits or the
queue closes; every write is guarded by its claim's ``run``, so running one
twice changes nothing the first did not.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from procq._core.entries import Entry, Wakeup
from procq._core.metrics import COMMIT_BUCKETS, Histogram, HistogramSnapshot
from procq._stores.base import Conn, Row, StoreUnavailable

if TYPE_CHECKING:
    from procq._durable.core import StoreCore

__all__ = [
    "GROUP_WINDOW",
    "PACE_LIMIT",
    "Commits",
    "Committer",
    "Fresh",
    "Write",
    "commit_claims",
    "commit_writes",
    "run_writes",
]

log = logging.getLogger("procq.store")


class Fresh:
    """A queued claim of a key that had no row: its live row, to insert."""

    __slots__ = ("row",)

    def __init__(self, row: Row) -> None:
        self.row = row


#: A queued write: a claim to insert (``Fresh``), an ended row to settle
#: (``Conn.settle``; consecutive ones go to the database together), or any
#: other write, as a function of the connection.
Write = Fresh | Row | Callable[[Conn], None]


def run_writes(conn: Conn, writes: list[Write]) -> None:
    """Make ``writes``: the claims first, in one batch, then the rest in order,
    the ended rows among them in batches.

    A claim is its key's first write here (a key's queued writes are
    committed before it is claimed again: ``StoreCore._settle_keys``), so it
    goes before the others; and an ended row of the same claim goes with it,
    as the one row inserted."""
    if any(type(w) is Fresh for w in writes):
        fresh: dict[str, Row] = {}
        rest: list[Write] = []
        for write in writes:
            if type(write) is Fresh:
                fresh[write.row.key] = write.row
            elif type(write) is Row and (live := fresh.get(write.key)) is not None and live.run == write.run:
                fresh[write.key] = write
            else:
                rest.append(write)
        conn.insert(list(fresh.values()))
        writes = rest
    rows: list[Row] = []
    for write in writes:
        if type(write) is Row:
            rows.append(write)
            continue
        if rows:
            conn.settle(rows)
            rows = []
        write(conn)  # type: ignore[operator]
    if rows:
        conn.settle(rows)


#: How long a group transaction of claims may stay open (seconds).
GROUP_WINDOW = 0.002
#: The longest the committer spaces two commits of outcomes (seconds).
PACE_LIMIT = 0.02
#: How often writes the store refused are tried again (seconds).
RETRY = 0.25


def commit_writes(core: StoreCore) -> list[Wakeup]:
    """``StoreCore.commit``: run the queued writes and commit them with the
    group transaction; the wake-ups released, for the caller to deliver. A
    store that refuses keeps the writes queued (``Commits.refused_since``)."""
    commits = core.commits
    with core.db_lock:
        if core.in_user_tx:
            return []  # the caller's transaction commits when it ends
        conn = core.conn
        taken = commits.take()
        if not taken and not conn.in_tx:
            return commits.done([])
        began = time.monotonic()
        try:
            if taken:
                if not conn.in_tx:
                    conn.begin()
                    began = time.monotonic()  # (waiting for the lock is not the commit's work: see pacing)
                run_writes(conn, [write for _, _, write in taken])
            conn.commit()
        except StoreUnavailable as exc:
            conn.rollback()
            core.group_since = None
            if commits.refused_since is None:
                log.warning("procq store %s: %d writes wait for it: %s", core.store.url, len(taken), exc)
            commits.refused_since = time.monotonic()
            commits.refusal = str(exc)
            return []
        except Exception:
            # Not the store's doing: a write that cannot be made. Its
            # waiters are told anyway rather than left waiting forever.
            conn.rollback()
            log.exception("procq store %s: %d writes could not be made", core.store.url, len(taken))
        core.group_since = None
        commits.last = time.monotonic()
        commits.took = commits.last - began
        ended = [write for _, _, write in taken if type(write) is Row]
        if ended:
            with core.lock:
                core.records_.committed(ended)  # (before their wake-ups run: see StoreCore.settled)
        return commits.done(taken, commits.took)


def commit_claims(core: StoreCore, fresh: list[Entry], wakeups: list[Wakeup]) -> str | None:
    """While the store refuses commits (it is full, read-only, gone), a push
    that claims keys (``fresh``) is answered only once its claims are
    committed (the wake-ups released go to ``wakeups``); else they go,
    leaving nothing (the failed commit rolled back), and why is returned for
    the push to raise. (db_lock held.)"""
    commits = core.commits
    if not fresh or commits.refused_since is None or core.in_user_tx:
        return None
    wakeups.extend(core.commit())
    if commits.refused_since is None:
        return None
    with core.lock:
        runs = {h.live.run for h in map(core.records_.held.get, (e.key for e in fresh)) if h is not None}
    commits.drop_claims(runs)
    core.rolled_back(fresh, "the store could not be written")
    return commits.refusal


class Commits:
    """The writes not yet committed, and the wake-ups waiting for them (see
    the module docstring). Its lock is a leaf: taken under ``Core.lock`` or
    alone, never around anything else."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending: list[tuple[int, str | None, Write]] = []  # (number, key, write); key None: a claim
        self.written = 0  # the last number given
        self.committed = 0  # every write up to this number is durable
        self.keys: collections.Counter[str] = collections.Counter()  # keys with uncommitted writes
        self._held: collections.deque[tuple[int, list[Wakeup]]] = collections.deque()
        self.refused_since: float | None = None  # the store refused the last commit (monotonic)
        self.refusal = ""  # why (the StoreUnavailable it raised)
        self.released = False  # release_all() was called
        self.last = 0.0  # when the last commit ended (monotonic), by any thread
        self.took = 0.0  # how long it took
        self.poke: Callable[[], None] = lambda: None
        # For the metrics (``_core.metrics``): commits' latency, and the seconds
        # the store refused commits in outages that ended.
        self.latency = Histogram(COMMIT_BUCKETS)
        self.outage = 0.0

    def add(self, key: str, write: Write) -> None:
        with self._lock:
            self.written += 1
            self.pending.append((self.written, key, write))
            self.keys[key] += 1
        self.poke()

    def add_claim(self, claim: Fresh) -> None:
        """Queue a claim's row. It goes with the group transaction (whose
        window the committer keeps already), and the claimed key is live
        here, not waiting for a commit: no poke, and not in ``keys``."""
        with self._lock:
            self.written += 1
            self.pending.append((self.written, None, claim))

    def drop_claims(self, runs: set[str]) -> None:
        """Forget the queued claims of these runs, unwritten: their push failed.
        (Under ``db_lock``, as every commit: a commit's ``done`` takes off the
        prefix of ``pending`` it took.)"""
        with self._lock:
            self.pending = [p for p in self.pending if type(p[2]) is not Fresh or p[2].row.run not in runs]

    def hold(self, wakeups: list[Wakeup]) -> bool:
        """Hold ``wakeups`` back until every write made so far is committed;
        False (nothing held) when all are already, or nothing waits any more."""
        with self._lock:
            if self.committed >= self.written or self.released:
                return False
            self._held.append((self.written, wakeups))
            return True

    def take(self) -> list[tuple[int, str | None, Write]]:
        with self._lock:
            return list(self.pending)

    def for_key(self, key: str) -> list[Write]:
        with self._lock:
            return [w for _, k, w in self.pending if k == key] if self.keys[key] else []

    def done(self, taken: list[tuple[int, str | None, Write]], took: float | None = None) -> list[Wakeup]:
        """``taken`` (a prefix of ``pending``) is committed (in ``took`` seconds,
        if a commit ran): the wake-ups it released."""
        wakeups: list[Wakeup] = []
        with self._lock:
            if taken:
                del self.pending[: len(taken)]
                for _, key, _ in taken:
                    if key is None:
                        continue
                    self.keys[key] -= 1
                    if not self.keys[key]:
                        del self.keys[key]
                # (Nothing left: every number given is durable, those of
                # writes dropped unwritten too: see drop_claims.)
                self.committed = taken[-1][0] if self.pending else self.written
            elif not self.pending:
                self.committed = self.written
            while self._held and self._held[0][0] <= self.committed:
                wakeups += self._held.popleft()[1]
            if took is not None:
                self.latency.observe(took)
            if self.refused_since is not None:  # an outage ended
                self.outage += time.monotonic() - self.refused_since
            self.refused_since = None
        return wakeups

    def metrics(self) -> tuple[HistogramSnapshot, float, bool, int]:
        """For ``_core.metrics``: the commits' latency, the seconds of outage (the
        current one included), whether the store takes commits, writes waiting."""
        with self._lock:
            refused = self.refused_since
            outage = self.outage + (0.0 if refused is None else time.monotonic() - refused)
            return self.latency.snapshot(), outage, refused is None, len(self.pending)

    def release_all(self) -> list[Wakeup]:
        """Every wake-up still held; from now on none is (the queue is
        cancelling or closed: nothing waits for the store any more)."""
        with self._lock:
            self.released = True
            wakeups = [w for _, ws in self._held for w in ws]
            self._held.clear()
            return wakeups


class Committer(threading.Thread):
    """Commits a store queue's writes and group transactions, then runs the
    wake-ups they released (see the module docstring)."""

    def __init__(self, core: StoreCore) -> None:
        super().__init__(name=f"procq-commit-{core.holder}", daemon=True)
        self.core = core
        self._cond = threading.Condition(threading.Lock())
        self._poked = False
        self._stopping = False
        core.commits.poke = self.poke

    def poke(self) -> None:
        """Commit now: writes are waiting."""
        if self._poked:
            # Poked already, and not yet taken the writes (it resets the flag
            # before it takes them): this write goes with that commit.
            return
        with self._cond:
            if not self._poked:  # (once a commit: not a wake-up of this thread per write)
                self._poked = True
                self._cond.notify()

    def notice(self) -> None:
        """A group transaction opened: commit it once its window is over."""
        with self._cond:
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self.join()

    def run(self) -> None:
        core = self.core
        commits = core.commits
        while True:
            with self._cond:
                while not self._stopping and (wait := self._wait()) != 0.0:
                    self._cond.wait(wait)
                if self._stopping:
                    return
                self._poked = False  # writes added from here on poke again
            if not commits.pending and core.group_since is None and commits.refused_since is None:
                continue  # another thread committed them meanwhile: no need of the connection
            try:
                wakeups = core.commit()
            except Exception:  # the thread must live on: the writes stay queued for the next try
                log.exception("procq store %s: committing failed", core.store.url)
                wakeups = []
            core.deliver_now(wakeups)

    def _wait(self) -> float | None:
        """How long to wait before the next commit (under ``_cond``): 0.0, now;
        None, until poked or a group transaction opens."""
        core, now = self.core, time.monotonic()
        commits = core.commits
        if commits.refused_since is not None:  # the store refused the last try: wait for the next one
            return max(0.0, commits.refused_since + RETRY - now)
        since = core.group_since
        if since is not None:  # a group holds its keys: committed at the end of its window, never later
            return max(0.0, since + GROUP_WINDOW - now)
        if self._poked:  # outcomes only: paced (see the module docstring)
            return max(0.0, commits.last + min(PACE_LIMIT, max(GROUP_WINDOW, 2 * commits.took)) - now)
        return None
