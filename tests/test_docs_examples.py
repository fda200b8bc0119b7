"""Every ```python block of README.md and docs/*.md runs, and prints what the page shows.

A block runs as a script of its own (``python example.py`` in a fresh temporary
directory, so a store file it makes stays there). Where a ```text output block
follows it (before the next python block), its stdout must equal that text.
A block that cannot run on its own says so in an HTML comment on the line just
before it: ``<!-- not run: why -->`` (reported as a skip, with the reason) or
``<!-- needs: module ... -->`` (run when those modules are installed). Also checked:
README links to every page under docs/, and every relative link resolves.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pg_server import pg_url

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"<!--\s*(not run|needs|twice at once):\s*(.*?)\s*-->")
FENCE = re.compile(r"^(\s*)```(\S*)(.*)$")


@dataclasses.dataclass
class Block:
    page: str
    line: int
    code: str
    output: str | None = None
    not_run: str | None = None
    needs: str | None = None
    twice: bool = False  # two copies at once, given a PostgreSQL store's URL

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, rest = m.group(1), m.group(2), m.group(3).strip()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        body = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
        if lang == "python":
            b = Block(str(path.relative_to(ROOT)), i + 1, body)
            mark = MARK.search(lines[i - 1]) if i else None
            if mark and mark.group(1) == "not run":
                b.not_run = mark.group(2)
            elif mark and mark.group(1) == "twice at once":
                b.twice = True
            elif mark:
                b.needs = mark.group(2)
            found.append(b)
        elif lang == "text" and rest == "output" and found and found[-1].output is None:
            found[-1].output = body
        del indent
        i = end + 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]


@pytest.mark.parametrize("block", [b for b in ALL if not b.twice], ids=[b.id for b in ALL if not b.twice])
def test_example_runs(block: Block, tmp_path: Path) -> None:
    if block.not_run is not None:
        pytest.skip(f"{block.id} {block.not_run}")
    missing = [m for m in (block.needs or "").split() if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{block.id} needs {' '.join(missing)}, not installed")
    (tmp_path / "example.py").write_text(block.code)
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, f"{block.id} exited {proc.returncode}:\n{proc.stderr}"
    if block.output is not None:
        assert proc.stdout.rstrip() == block.output.rstrip(), f"{block.id} printed:\n{proc.stdout}"


TWICE = [b for b in ALL if b.twice]


@pytest.mark.parametrize("block", TWICE, ids=[b.id for b in TWICE])
def test_two_copies_of_an_example_share_a_postgresql_store(
    block: Block, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two programs on one store split the work: every page is run by exactly one of them."""
    url = pg_url(request)
    (tmp_path / "example.py").write_text(block.code)
    copies = [
        subprocess.Popen([sys.executable, "example.py", url], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    ran = []
    for p in copies:
        out, _ = p.communicate(timeout=50)
        assert p.returncode == 0, f"{block.id} exited {p.returncode}"
        found = re.fullmatch(r"this program ran (\d+) of 50 pages\n", out)
        assert found, f"{block.id} printed:\n{out}"
        ran.append(int(found.group(1)))
    assert sum(ran) == 50


def test_marks_say_why() -> None:
    for b in ALL:
        assert b.not_run is None or len(b.not_run) > 10, f"{b.id}: say why it is not run"
    not_run = [b for b in ALL if b.not_run is not None]
    assert len(not_run) * 2 < len(ALL) + 10, "most examples should run"


def test_readme_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    first = text.split("```sh\n", 1)[1].split("```", 1)[0]
    assert ".venv/bin/pip install . && .venv/bin/python -m procq demo" in first
    extras = "test,postgres,dask,joblib,prometheus,otel,top"
    assert f".venv/bin/pip install -e '.[{extras}]' && .venv/bin/python -m pytest" in first


def test_links_resolve_and_readme_reaches_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert f"](docs/{page.name})" in readme, f"README does not link to docs/{page.name}"
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def test_fault_table_procq_row() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.faults", "--engines", "procq"],
        cwd=ROOT, capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "| `procq.Executor` | 9 | 3 | 0 | 0 | yes |" in proc.stdout
