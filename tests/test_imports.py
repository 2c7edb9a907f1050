"""batchrun's imports, read with ast (imports inside functions count: one moved into a function to
dodge a cycle is still a cycle): no import cycles between modules, the core (job/, run/,
export/, openai/) never imports the server (serve/), and nothing imports the CLI (cli/)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "batchrun"
CORE = ("job", "run", "export", "openai")


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The batchrun modules that module `name` imports, anywhere in it (functions too)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join([*base, node.module] if node.module else base)
            else:
                origin = node.module or ""
            # `from pkg import mod` imports the module; `from mod import name`, the module.
            targets = [
                f"{origin}.{a.name}" if f"{origin}.{a.name}" in known else origin
                for a in node.names
            ]
        for target in targets:
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != name:
                yield target


def graph() -> dict[str, set[str]]:
    """Module -> the batchrun modules it imports."""
    known = modules()
    return {name: set(imported(name, path, known)) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def package_of(module: str) -> str:
    """The top-level part of batchrun a module belongs to ("run", "config", ...)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_walk_sees_function_local_and_relative_imports(tmp_path: Path) -> None:
    """The reader finds an import inside a function, and resolves a relative one."""
    source = tmp_path / "m.py"
    source.write_text(
        "def f():\n    from batchrun.serve import jobview\n    from . import records\n"
    )
    known = {
        "batchrun.openai.m": source,
        "batchrun.serve.jobview": source,
        "batchrun.openai.records": source,
    }
    assert set(imported("batchrun.openai.m", source, known)) == {
        "batchrun.serve.jobview",
        "batchrun.openai.records",
    }
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_cycles() -> None:
    assert [sorted(c) for c in cycles(graph())] == []


def test_the_core_never_imports_the_server() -> None:
    edges = graph()
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in edges.items()
        if package_of(module) in CORE
        for target in targets
        if package_of(target) == "serve"
    )
    assert wrong == []


def test_nothing_imports_the_cli() -> None:
    edges = graph()
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in edges.items()
        if package_of(module) not in ("cli", "__main__")
        for target in targets
        if package_of(target) == "cli"
    )
    assert wrong == []


def test_object_storage_stays_at_the_edge() -> None:
    """Only submit's core (run/commands.py) and the CLI know of buckets (storage/), and
    storage/ imports nothing of batchrun but errors: a job never depends on the store."""
    edges = graph()
    users = sorted(
        module
        for module, targets in edges.items()
        if package_of(module) not in ("storage", "cli")
        and any(package_of(t) == "storage" for t in targets)
    )
    assert users == ["batchrun.run.commands"]
    uses = sorted(
        {
            package_of(target)
            for module, targets in edges.items()
            if package_of(module) == "storage"
            for target in targets
        }
        - {"storage"}
    )
    assert uses == ["errors"]
