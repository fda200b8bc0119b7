"""procq under chaos: thousands of jobs across every way a job can end,
pushed from several threads with duplicates, batches and random cancels
(``bench/chaos.py`` says what is checked; ``python -m bench.chaos --jobs N``
runs a longer setting)."""

from __future__ import annotations

import pytest

from bench.chaos import run_chaos


@pytest.mark.timeout(300)
def test_every_promise_holds_under_chaos() -> None:
    summary = run_chaos(jobs=4000, seed=20261203)
    assert summary["keys"] > 1000
    assert summary["answers"].get("Queued", 0) > 1000
    assert summary["answers"].get("InFlight", 0) > 100  # duplicates joined live keys
    # Kills from outside happened, of idle and of busy workers (run_chaos checks no job was blamed for an idle one).
    assert summary["workers killed idle"] > 0
    assert summary["workers killed busy"] > 0
