"""Symlinks in a sandbox's ``read=`` and ``write=``: a named link gives the
job its target (readable by either path); a link inside a given directory
reaches nothing outside the paths the job was given."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jobs_sandbox as js
import pytest
from core_support import WAIT, open_queue

from procq import Job, Lane, Sandbox

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sandboxes are Linux's")


def test_a_named_link_gives_its_target_and_a_link_inside_a_given_directory_reaches_nothing_outside(
    tmp_path: Path,
) -> None:
    """What the job was not given does not exist in its view: a link to it leads nowhere."""
    elsewhere, links, given, out = (tmp_path / n for n in ("elsewhere", "links", "given", "out"))
    for d in (elsewhere, links, given, out):
        d.mkdir()
    (elsewhere / "target.txt").write_text("target")
    (elsewhere / "other.txt").write_text("other")
    (links / "named.txt").symlink_to(elsewhere / "target.txt")  # named in read=
    (given / "inner.txt").symlink_to(elsewhere / "other.txt")  # inside a read= directory
    (out / "inner.txt").symlink_to(elsewhere / "other.txt")  # inside a write= directory
    (given / "local.txt").write_text("local")
    (given / "sibling.txt").symlink_to("local.txt")  # a relative link that stays inside
    sandbox = Sandbox(read=(str(links / "named.txt"), str(given)), write=(str(out),))
    with open_queue({"s": Lane(workers=1, trusted=False, sandbox=sandbox)}) as q:
        paths = [str(p) for p in (links / "named.txt", elsewhere / "target.txt", given / "inner.txt",
                                  out / "inner.txt", elsewhere / "other.txt", given / "sibling.txt")]  # fmt: skip
        said = q.push_and_wait(Job("links", js.read_files, args=(paths,)), timeout=WAIT)
    reached = {os.path.relpath(p, tmp_path): how for p, how in said.items()}
    assert reached["links/named.txt"] == "reached: 'target'"
    assert reached["elsewhere/target.txt"] == "reached: 'target'"  # the named link's target, by its own path
    assert reached["given/sibling.txt"] == "reached: 'local'"
    for path in ("given/inner.txt", "out/inner.txt", "elsewhere/other.txt"):
        assert reached[path].startswith("refused: FileNotFoundError"), (path, reached[path])


def test_a_named_link_to_a_directory_in_write_gives_its_target_to_write_in(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "file").write_text("original")
    (tmp_path / "link").symlink_to(target)
    sandbox = Sandbox(write=(str(tmp_path / "link"),))
    with open_queue({"s": Lane(workers=1, trusted=False, sandbox=sandbox)}) as q:
        by_link = q.push_and_wait(
            Job("by link", js.change_files, args=(str(tmp_path / "link" / "file"), str(tmp_path / "link"))),
            timeout=WAIT,
        )
        by_target = q.push_and_wait(Job("by target", js.read_files, args=([str(target / "new")],)), timeout=WAIT)
    assert by_link["write"].startswith("reached") and by_link["create"].startswith("reached"), by_link
    assert (target / "new").read_text() == "x"  # made through the link, in its target
    assert by_target == {str(target / "new"): "reached: 'x'"}
