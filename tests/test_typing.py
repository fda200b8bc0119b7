"""procq's public types, checked: mypy (strict) over ``tests/typing``, which pins
inferred types with ``assert_type`` and expected errors with ``type: ignore``."""

from __future__ import annotations

from pathlib import Path

import pytest

from procq import Job

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(180)
def test_mypy_accepts_the_typed_usage_and_its_pinned_errors() -> None:
    api = pytest.importorskip("mypy.api")
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), str(ROOT / "tests" / "typing")])
    assert status == 0, out + err


def test_job_of_makes_the_job_job_makes() -> None:
    def fn(a: int, b: int = 0, *, lane: str = "") -> str:
        return f"{a}{b}{lane}"

    job = Job.of("k", fn, lane="cpu", timeout=5)(1, b=2, lane="fn's own")
    assert job == Job("k", fn, (1,), {"b": 2, "lane": "fn's own"}, lane="cpu", timeout=5)
    assert Job.of("k", fn)(1).kwargs is None
    with pytest.raises(TypeError, match="lane must be a str"):
        Job.of("k", fn, lane=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        Job.of("", fn)
