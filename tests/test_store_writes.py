"""The writes a store queue makes in its group transaction (``run_writes``),
on a real database: claims written with the group, and a job that ended
before its claim was written leaving one row, its ended one.

The queue-level guarantees (one execution across processes, outcomes durable
before anyone hears of them) are in test_store.py; these check the rows the
batched writes leave, which no timing of a running queue can pin down."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from procq import Completed, Failed
from procq._durable.commit import Commits, Fresh, run_writes
from procq._model.values import Failure
from procq._stores.base import Conn, Row, encode_outcome
from procq._stores.urls import open_store


def live(key: str, run: str = "q1/1", holder: str = "q1") -> Row:
    return Row(key, "live", run, holder, b"fp", None, None, None, 1, None, time.time(), None)


def ended(row: Row, outcome: Completed[object] | Failed) -> Row:
    state, output, encoding, failure = encode_outcome(outcome, True)
    return row._replace(state=state, holder=None, output=output, encoding=encoding, failure=failure, ended=time.time())


@pytest.fixture
def conn(url: str) -> Iterator[Conn]:
    c = open_store(url).connect()
    yield c
    c.close()


def commit(conn: Conn, writes: list[object]) -> None:
    conn.begin()
    run_writes(conn, writes)  # type: ignore[arg-type]
    conn.commit()


def test_claims_are_written_with_the_group_and_an_ended_one_as_its_ended_row(conn: Conn) -> None:
    a, b, c = live("a"), live("b", "q1/2"), live("c", "q1/3")
    a_done = ended(a, Completed([1, 2]))
    c_failed = ended(c, Failed(Failure("error", "boom", exc_type="ValueError")))
    commit(conn, [Fresh(a), Fresh(b), a_done, Fresh(c), c_failed])

    rows = conn.rows(["a", "b", "c"])
    assert rows["a"].state == "done" and rows["a"].outcome() == Completed([1, 2]) and rows["a"].holder is None
    assert rows["b"] == b
    assert rows["c"].state == "failed" and rows["c"].outcome().failure.message == "boom"  # type: ignore[union-attr]
    assert conn.exists("a") and not conn.exists("d")


def test_an_ended_row_of_a_claim_written_earlier_settles_it(conn: Conn) -> None:
    a = live("a")
    commit(conn, [Fresh(a)])
    commit(conn, [ended(a, Completed(7))])
    assert conn.rows(["a"])["a"].outcome() == Completed(7)


def test_a_claim_given_back_in_the_same_group_leaves_no_row(conn: Conn) -> None:
    a = live("a")
    commit(conn, [Fresh(a), lambda c: c.delete("a", a.run)])
    assert conn.rows(["a"]) == {}


def test_a_claim_written_late_leaves_another_queues_row_alone(conn: Conn) -> None:
    # A group that failed to commit is written again in a later one; if
    # another queue claimed the key in between, its row stays.
    theirs = live("a", "q2/1", "q2")
    commit(conn, [Fresh(theirs)])
    mine = live("a")
    commit(conn, [Fresh(mine), ended(mine, Completed("mine")), Fresh(live("b", "q1/2"))])
    rows = conn.rows(["a", "b"])
    assert rows["a"] == theirs
    assert rows["b"].state == "live"


def test_a_claim_waits_for_no_poke_and_counts_as_no_write_of_its_key() -> None:
    commits = Commits()
    poked: list[int] = []
    commits.poke = lambda: poked.append(1)
    commits.add_claim(Fresh(live("a")))
    assert poked == [] and not commits.keys
    # A wake-up given now waits for the claim's write, like any write before it.
    woken: list[int] = []
    assert commits.hold([lambda: woken.append(1)])
    commits.add("a", ended(live("a"), Completed(1)))
    assert poked == [1] and commits.keys["a"] == 1
    released = commits.done(commits.take())
    for wake in released:
        wake()
    assert woken == [1] and not commits.keys and not commits.pending


def test_a_batch_of_claims_inserts_keys_with_no_row_and_returns_the_others(conn: Conn) -> None:
    from procq._stores.base import Taken

    theirs = live("held", "q2/1", "q2")
    commit(conn, [Fresh(theirs), Fresh(live("done", "q2/2", "q2"))])
    commit(conn, [ended(live("done", "q2/2", "q2"), Completed(5))])
    conn.begin()
    conn.lock_all(["done", "held", "new"])
    got = conn.claim_held([live("new"), live("held", "q1/2"), live("done", "q1/3")])
    conn.commit()
    assert got[0] is Taken.INSERTED
    assert got[1] == (theirs, False)  # (q2 holds no lease here: not alive)
    row, alive = got[2]  # type: ignore[misc]
    assert row.outcome() == Completed(5) and alive is False
    new = conn.rows(["new"])["new"]
    assert (new.state, new.run, new.holder) == ("live", "q1/1", "q1")
