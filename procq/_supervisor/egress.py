"""A lane's network allow-list, as its untrusted channel uses it: the lane's
egress proxy (``_system.egress_proxy``, one per lane, made with its first
worker and closed with the lane), each worker's gate to it, and what a job
that was refused something says when it ends: its ``Failure`` names the
refusals, and one WARNING line per job logs them.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from typing import TYPE_CHECKING, Any

from procq._model.network import AllowList, Refused, describe
from procq._model.sandbox import Sandbox
from procq._model.values import Completed, Failed
from procq._system.egress_proxy import EgressProxy, Gate

if TYPE_CHECKING:
    from procq._core.channel import Launch
    from procq._core.entries import Entry, LaneState

__all__ = ["close_proxy", "open_gate", "tell", "with_refusals"]

_log = logging.getLogger("procq.sandbox")
_KEY = "egress"  # the lane's proxy, in Launch.lanes[lane name]


def open_gate(
    lane: LaneState, launch: Launch, config: dict[str, Any] | None
) -> tuple[Gate | None, socket.socket | None]:
    """For a worker about to start: its gate, and the bridge's end to pass it
    (its number goes into ``config["bridge"]``); (None, None) for a lane
    without an allow-list, or whose list the kernel cannot enforce (relaxed:
    then its jobs get no network)."""
    sandbox = lane.spec.sandbox
    if config is None or not isinstance(sandbox, Sandbox) or not isinstance(sandbox.network, tuple):
        return None, None
    if "network" not in config["parts"]:
        return None, None
    kept = launch.lanes.setdefault(lane.name, {})
    proxy = kept.get(_KEY) if isinstance(kept, dict) else None
    if proxy is None:
        proxy = EgressProxy(lane.name, AllowList(sandbox.network), max_bytes=sandbox.network_bytes)
        kept[_KEY] = proxy
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    gate = proxy.gate(ours)
    config["bridge"] = theirs.fileno()
    return gate, theirs


def close_proxy(lane: LaneState, launch: Launch) -> None:
    """The lane is closed and its workers reaped: stop its proxy."""
    kept = launch.lanes.get(lane.name)
    proxy = kept.pop(_KEY, None) if isinstance(kept, dict) else None
    if proxy is not None:
        proxy.close()


def tell(lane: LaneState, key: str, refused: tuple[Refused, ...]) -> str | None:
    """Job ``key`` ended, refused ``refused``: recorded for its handle and
    the lane's metrics (``LaneState.refusals``) and logged once at WARNING;
    the words, if it was refused anything."""
    lane.refusals.record(key, refused)
    if not refused:
        return None
    text = describe(refused)
    _log.warning("job %r of lane %r: %s", key, lane.name, text)
    return text


def with_refusals(
    entry: Entry, lane: LaneState, outcome: Completed[Any] | Failed, refused: tuple[Refused, ...]
) -> Completed[Any] | Failed:
    """A job's outcome, told what the sandbox refused it: recorded for its
    handle and the lane's metrics (``LaneState.refusals``), logged once at
    WARNING, and at the end of a failure's message."""
    text = tell(lane, entry.key, refused)
    if text is not None and isinstance(outcome, Failed):
        failure = outcome.failure
        return type(outcome)(dataclasses.replace(failure, message=f"{failure.message} ({text})"))
    return outcome
