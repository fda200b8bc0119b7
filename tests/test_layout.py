"""The package's layout: subpackages that say what they hold, no import cycles,
modules of one job each, and pickles from before the layout still loading.
(The layers themselves are import-linter's contracts in pyproject.toml, which
CI checks with ``lint-imports``.)"""

from __future__ import annotations

import ast
import pathlib
import pickle

import pytest

import procq
from procq._moved import MOVED

PACKAGE = pathlib.Path(procq.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: pathlib.Path, type_checking: bool = False) -> set[str]:
    """The procq modules ``path`` imports when it runs (lazy imports in
    functions included; imports under ``if TYPE_CHECKING`` left out, unless
    ``type_checking``)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if not type_checking and isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for orelse in child.orelse:
                    visit(orelse)
                continue
            if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                if child.module.startswith("procq"):
                    found.add(child.module)
                    found.update(f"{child.module}.{a.name}" for a in child.names)
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("procq"))
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def _import_graph(type_checking: bool) -> dict[str, list[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: sorted(_imports(path, type_checking) & files.keys() - {name}) for name, path in files.items()}
    # A package's __init__ is imported by every import of its modules: that
    # edge is not a cycle of ours.
    return {name: [t for t in targets if not name.startswith(t + ".")] for name, targets in graph.items()}


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """One cycle through each part of ``graph`` that has any (depth first)."""
    state: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name)
    return found


def test_no_module_takes_part_in_an_import_cycle() -> None:
    assert [" -> ".join(cycle) for cycle in _cycles(_import_graph(type_checking=False))] == []


#: Subpackages whose modules still import each other in a circle, counting the
#: imports made for type checking only. Each one untangled leaves this set;
#: none may join it.
TYPE_ONLY_CIRCLES = {"procq._api", "procq._core", "procq._durable"}


def test_no_new_subpackage_imports_in_a_circle_counting_type_only_imports() -> None:
    # Inside a subpackage, a module that needs another's types only to check
    # them still makes the two one room: one cannot be read or changed alone.
    def subpackage(name: str) -> str:
        return ".".join(name.split(".")[:2])

    graph = _import_graph(type_checking=True)
    inside = {name: [t for t in targets if subpackage(t) == subpackage(name) != t] for name, targets in graph.items()}
    circled = {subpackage(cycle[0]) for cycle in _cycles(inside)}
    assert circled == TYPE_ONLY_CIRCLES


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500
    }
    assert long == {}


@pytest.mark.parametrize("package", sorted(p.parent.name for p in PACKAGE.glob("_*/__init__.py")))
def test_each_subpackage_docstring_names_each_of_its_modules(package: str) -> None:
    init = PACKAGE / package / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    modules = sorted(p.stem for p in init.parent.glob("*.py") if p.stem != "__init__")
    assert modules, package
    assert [m for m in modules if f"``{m}``" not in doc] == []


def _as_before(obj: object, old: str, new: str) -> bytes:
    """``obj`` pickled as an earlier procq would have: naming ``old``, where
    its class lived, instead of ``new``. (Protocol 2 names classes as text.)"""
    data = pickle.dumps(obj, protocol=2)
    assert f"c{new}\n".encode() in data
    return data.replace(f"c{new}\n".encode(), f"c{old}\n".encode())


@pytest.mark.parametrize(
    ("obj", "old"),
    [
        (procq.Failure(kind="crashed", message="boom", signal="SIGKILL"), "procq._values"),
        (procq.Completed(42), "procq._values"),
        (procq.Cached(7), "procq._values"),
        (procq.Lane(workers=2), "procq._job"),
        (procq.Retry(attempts=2), "procq._job"),
        (procq.Retention(ttl=5.0), "procq._job"),
        (procq.JobFailed("k", procq.Failure(kind="error", message="no")), "procq._errors"),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, str) else v,
)
def test_a_public_value_pickled_under_its_old_module_still_loads(obj: object, old: str) -> None:
    assert old in MOVED
    loaded = pickle.loads(_as_before(obj, old, type(obj).__module__))
    assert type(loaded) is type(obj)
    if isinstance(obj, procq.JobFailed):
        assert (loaded.key, loaded.failure) == (obj.key, obj.failure)
    else:
        assert loaded == obj


def test_an_old_module_name_without_the_attribute_says_where_it_moved() -> None:
    import importlib

    old = importlib.import_module("procq._values")
    with pytest.raises(AttributeError, match=r"procq\._values.*procq\._model\.values.*no attribute 'Nope'"):
        old.Nope  # noqa: B018
