"""The egress proxy against hostile jobs, with the supervisor as root and as
the ordinary user ``nobody``: each attack (``egress_program.CASES``) is
refused as it should be, and leaves the supervisor as it was: no exception
in any of its threads, no socket left for the collector, its open fds and
threads back to where they were, its RSS within a few MiB, and a canary
lane that kept answering. Each run is a program of its own
(``egress_program``): a uid is a process's."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from process_support import json_program

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sandboxes are Linux's")

HERE = Path(__file__).parent
MIB = 1 << 20
SECOND = "a second request on one connection: one request per connection"


def _run(mode: str) -> dict[str, Any]:
    argv = [sys.executable, "-I", str(HERE / "egress_program.py"), mode, str(HERE), str(HERE.parent)]
    return json_program(argv, 300)


@pytest.fixture(scope="module", params=["root", "nobody"])
def said(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "nobody" and os.getuid() != 0:
        pytest.skip("becoming nobody needs root; as another user, the root run is this one")
    said = _run(request.param)
    assert said["uid"] == (65534 if request.param == "nobody" else os.getuid())
    return said


def _refused(case: dict[str, Any]) -> list[tuple[str, str]]:
    return [(what, why) for what, why, _ in case["refused"]]


def test_nothing_escapes_the_proxys_threads_and_no_socket_is_left_to_the_collector(said: dict[str, Any]) -> None:
    assert said["raised"] == []
    assert [w for w in said["warned"] if "socket" in w] == []


@pytest.mark.parametrize(
    "name",
    [
        "a port of digits that are not ASCII", "a request framed two ways", "a head past its limit",
        "a second request after a checked one", "a second request through SOCKS5", "another host through SOCKS5",
        "request heads past network_bytes", "refusals in a loop", "a handshake a byte at a time",
        "a tunnel whose ClientHello never comes", "the connection limit held open",
    ],
)  # fmt: skip
def test_each_attack_leaves_the_supervisor_as_it_was(said: dict[str, Any], name: str) -> None:
    case = said["cases"][name]
    before, after = case["before"], case["after"]
    assert after["fds"] <= before["fds"], case
    assert after["threads"] <= before["threads"], case
    assert after["rss"] - before["rss"] < 4 * MIB, case
    canary = case["canary"]
    assert canary["answered"] > 0 and canary["failed"] == 0, canary
    assert canary["longest"] < 5.0, canary  # it kept answering (a stall would be seconds)


def test_malformed_requests_are_answered_400_and_refused(said: dict[str, Any]) -> None:
    for name, why in [
        ("a port of digits that are not ASCII", "illegal request line"),
        ("a request framed two ways", "both Content-Length and Transfer-Encoding"),
        ("a head past its limit", "a request head longer than 65536 bytes"),
    ]:
        case = said["cases"][name]
        assert case["result"].split(" ")[1] == "400", case
        assert [what for what, _ in _refused(case)] == ["malformed"] and why in _refused(case)[0][1], case


def test_nothing_after_a_checked_request_reaches_the_listed_server(said: dict[str, Any]) -> None:
    for name in ("a second request after a checked one", "a second request through SOCKS5"):
        case = said["cases"][name]
        assert all(path == "/first" for _, path, _ in case["seen"]) and len(case["seen"]) <= 1, case
        assert _refused(case) == [("malformed", SECOND)], case
    case = said["cases"]["another host through SOCKS5"]
    assert case["seen"] == [] and case["result"] == ["HTTP/1.1 403 Forbidden"], case
    assert _refused(case) == [("malformed", "the Host header names another host")], case


def test_request_heads_count_towards_network_bytes(said: dict[str, Any]) -> None:
    case = said["cases"]["request heads past network_bytes"]
    passed = case["result"].count("200")
    assert 10 <= passed <= 17 and "200" not in case["result"][passed:], case  # 17 heads of 60 KiB pass 1 MiB
    assert {what for what, _ in _refused(case)} == {"limit"}, case


def test_refusals_in_a_loop_are_kept_bounded(said: dict[str, Any]) -> None:
    case = said["cases"]["refusals in a loop"]
    assert case["result"] == ["HTTP/1.1 403 Forbidden x2000"], case
    records = case["refused"]
    assert len(records) <= 33 and sum(times for _, _, times in records) == 2000, records
    assert case["after"]["rss"] - case["before"]["rss"] < 4 * MIB, case


def test_a_handshake_a_byte_at_a_time_ends_at_its_deadline(said: dict[str, Any]) -> None:
    case = said["cases"]["a handshake a byte at a time"]
    assert case["result"].startswith("closed after "), case
    assert _refused(case) == [("malformed", "not finished within 2 s")], case


def test_a_tunnels_client_hello_is_due_by_the_handshakes_deadline(said: dict[str, Any]) -> None:
    case = said["cases"]["a tunnel whose ClientHello never comes"]
    assert case["result"].startswith("closed after "), case
    assert _refused(case) == [("malformed", "not finished within 2 s")], case


def test_the_sandbox_logs_bounded_lines(said: dict[str, Any]) -> None:
    """One WARNING line per job refused anything, whatever it tried (2,000
    refusals of as many targets among them)."""
    assert said["logged"] and max(said["logged"]) < 16 << 10, said["logged"]


def test_the_connection_limit_held_open_costs_the_supervisor_little(said: dict[str, Any]) -> None:
    case = said["cases"]["the connection limit held open"]
    assert case["result"] == 64 and case["refused"] == [], case
    assert case["peak rss"] - case["before"]["rss"] < 16 * MIB, case  # a 1 MiB buffer each way would be 128
