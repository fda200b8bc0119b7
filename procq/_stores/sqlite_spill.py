"""Large outputs in a SQLite store, written in pieces.

SQLite has one write lock per file, and a transaction holds it until it
commits. A row holding a 30 MB output took 150-450 ms to write, and every
other write of the file waited that long: the next push's claim, the small
outcomes committed after it (and so the answers waiting for them), other
programs' writes. So an output longer than ``SPILL_OVER`` is *spilled*:
before its row is written, it goes into ``procq_pieces``, ``PIECE`` bytes a
row, each piece a transaction of its own on a connection of its own
(``SqliteConn.spill``), so the lock is never held for more than one piece,
and other writes take their turns between pieces. The key's ended row then
holds a stub (how many pieces, how many bytes) and the encoding prefixed with
``SPILLED``; every read of a row puts the output back together
(``whole_output``), so nothing above the store sees pieces.

A piece is written only while its claim's live row is there (the insert says
so), so pieces never outlive the claim they were spilled for by more than a
sweep: with every lease renewal, the pieces of a key whose row is gone, or
ended without them (forgotten, swept by retention, replaced by a later run,
or written whole after a spill that failed half-way) are found by a read
(``ORPHANS``), then deleted a piece a transaction (``DROP_ORPHAN``: freeing
a piece's pages is work too, and a sweep that deleted 256 pieces at once
held the lock for a second). The pieces of a key that is live again are
kept: an abandoned claim puts back the row it replaced, pieces and all.

Checkpoints: the pieces pass through the write-ahead log, and SQLite copies
the log into the file (a checkpoint) in the commit that finds it long, on
whichever connection that is: a queue's commit of a small outcome took 650
ms copying pieces. The spilling connection checkpoints after each piece, so
what a later commit finds left to copy is its own.

A file with spilled rows is marked schema 2 in ``procq_meta``: an older
procq, which would read a stub as the output, refuses it.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from procq._stores.base import StoreError

__all__ = ["DDL", "DROP_ORPHAN", "ORPHANS", "PIECE", "SPILLED", "SPILL_OVER", "pieces", "whole_output"]

#: An output longer than this (bytes, as encoded) is spilled in pieces.
SPILL_OVER = 2 << 20
#: The bytes of one piece (one transaction).
PIECE = 1 << 20
#: The prefix of a spilled row's encoding.
SPILLED = "pieces:"
#: The schema a file with spilled rows is marked with.
SPILL_SCHEMA = 2

DDL = (
    "CREATE TABLE IF NOT EXISTS procq_pieces ("
    "key TEXT NOT NULL, run TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (run, seq))"
)
#: One piece, written only while the claim's live row is there.
ADD_PIECE = (
    "INSERT OR REPLACE INTO procq_pieces (key, run, seq, data) SELECT ?, ?, ?, ? "
    "WHERE EXISTS (SELECT 1 FROM procq_keys WHERE key = ? AND run = ? AND state = 'live')"
)
#: No row needs the piece (see the module docstring).
_UNNEEDED = (
    "NOT EXISTS (SELECT 1 FROM procq_keys k WHERE k.key = procq_pieces.key AND (k.state = 'live' OR "
    f"(k.run = procq_pieces.run AND k.encoding LIKE '{SPILLED}%')))"
)
#: Pieces no row needs, a batch at a time, found by a read (no lock).
ORPHANS = f"SELECT run, seq FROM procq_pieces WHERE {_UNNEEDED} LIMIT 256"
#: One of them deleted, if no row needs it still.
DROP_ORPHAN = f"DELETE FROM procq_pieces WHERE run = ? AND seq = ? AND {_UNNEEDED}"
_READ = "SELECT data FROM procq_pieces WHERE run = ? ORDER BY seq"


def pieces(output: bytes) -> list[memoryview]:
    """``output`` cut in pieces of ``PIECE`` bytes (views: no copy)."""
    view = memoryview(output)
    return [view[i : i + PIECE] for i in range(0, len(output), PIECE)]


def stub(output: bytes) -> bytes:
    """What a spilled row holds in place of ``output``: its pieces and length."""
    return f"{-(-len(output) // PIECE)} {len(output)}".encode()


def whole_output(db: sqlite3.Connection, key: str, run: str, output: Any, encoding: str) -> tuple[bytes, str]:
    """A spilled row's (output, encoding), its pieces put back together (the
    caller has seen ``encoding`` start with ``SPILLED``)."""
    count, length = (int(n) for n in bytes(output).split())
    parts = [r[0] for r in db.execute(_READ, (run,)).fetchall()]
    data = b"".join(parts)
    if len(parts) != count or len(data) != length:
        raise StoreError(
            f"the store's output of key {key!r} is incomplete ({len(parts)} of {count} pieces, {len(data):,} of "
            f"{length:,} bytes): forget the key (q.forget) to run it again"
        )
    return data, encoding[len(SPILLED) :]
