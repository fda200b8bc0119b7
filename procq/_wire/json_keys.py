"""The dict keys of an untrusted job's result, checked in the job's process:
JSON would turn a key that is not a ``str`` into one, silently."""

from __future__ import annotations

from typing import Any

__all__ = ["NonStrKey", "check_keys"]


class NonStrKey(TypeError):
    """A result holds a dict with a key that is not a str (reported, never
    raised to a caller): JSON would turn it into a string silently."""


def check_keys(result: Any) -> None:
    """Raise ``NonStrKey`` if ``result`` holds, at any depth, a dict with a
    key that is not a ``str``. ``json`` would write ``{1: "one"}`` as
    ``{"1": "one"}`` and the caller would get back another value than the
    job returned. Only lists, tuples and dicts are walked (what else JSON
    cannot hold fails its encoding); each container once, so a cycle ends
    here and fails at the encoding."""
    todo = [result]
    seen: set[int] = set()
    while todo:
        value = todo.pop()
        if isinstance(value, dict):
            if not value or id(value) in seen:
                continue
            seen.add(id(value))
            for key in value:
                if not isinstance(key, str):
                    where = _path_to(result, key) or "the result"
                    raise NonStrKey(
                        f"{where} has the key {key!r:.80} ({type(key).__name__}): an untrusted lane's results "
                        "travel as JSON, so every dict key in them must be a str"
                    )
            todo.extend(value.values())
        elif isinstance(value, (list, tuple)) and value and id(value) not in seen:
            seen.add(id(value))
            todo.extend(value)


def _path_to(result: Any, key: Any) -> str:
    """Where in ``result`` the first dict holding ``key`` is, as Python reads
    it (``result['a'][1]``); "" if the search goes too deep."""
    from collections import deque

    todo: deque[tuple[Any, str]] = deque([(result, "result")])
    seen: set[int] = set()
    while todo:
        value, path = todo.popleft()
        if id(value) in seen or len(path) > 200:
            continue
        if isinstance(value, dict):
            seen.add(id(value))
            if any(k is key for k in value):
                return path
            todo.extend((v, f"{path}[{k!r:.40}]") for k, v in value.items() if isinstance(k, str))
        elif isinstance(value, (list, tuple)):
            seen.add(id(value))
            todo.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
    return ""
