"""batchrun's imports, read with ast (imports inside functions and under TYPE_CHECKING count: one
moved into a function to dodge a cycle is still a cycle): no import cycles between modules nor
between packages, each package imports exactly what its row of the table in docs/architecture.md
("Packages and what each may import") lists, the core (job/, run/, export/, openai/) never imports
the server (serve/), and nothing imports the CLI (cli/).

A package here is each folder of batchrun/ with an __init__.py (`run/`) and each top-level module
(`config.py`, `errors.py`, `__init__.py`, ...)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from support.paths import ROOT

PACKAGE = ROOT / "batchrun"
CORE = ("job", "run", "export", "openai")
ARCHITECTURE = ROOT / "docs" / "architecture.md"
TABLE_HEADING = "## Packages and what each may import"


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
    """The top-level part of batchrun a module belongs to ("run", "config", ...; the package's
    own __init__.py is "__init__")."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def package_graph(edges: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """Package -> each package it imports -> the module imports that make it so (`a -> b`)."""
    found: dict[str, dict[str, list[str]]] = {package_of(m): {} for m in edges}
    for module, targets in edges.items():
        for target in targets:
            a, b = package_of(module), package_of(target)
            if a != b:
                found[a].setdefault(b, []).append(f"{module} -> {target}")
    return found


def row_name(package: str) -> str:
    """How the table names a package: `run/` for a folder, `config.py` for a module."""
    return f"{package}/" if (PACKAGE / package).is_dir() else f"{package}.py"


def table(text: str) -> dict[str, set[str]]:
    """The table under TABLE_HEADING: package (`run`, `config`) -> the packages its row lets it
    import (the names in backticks of its last column; `nothing` lists none)."""
    lines = text.split(TABLE_HEADING, 1)[1].strip().splitlines()
    rows: dict[str, set[str]] = {}
    for line in lines[2:]:  # the header and its rule
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = cells[0].strip("`").removesuffix("/").removesuffix(".py")
        assert name not in rows, f"{cells[0]} has two rows in {ARCHITECTURE.name}'s table"
        rows[name] = set(re.findall(r"`([^`]+)`", cells[-1]))
    return rows


def row(package: str, imports: set[str], what: str = "<what it is>") -> str:
    """A row of the table, as it should be written."""
    listed = ", ".join(f"`{p}`" for p in sorted(imports)) or "nothing"
    return f"| `{row_name(package)}` | {what} | {listed} |"


def table_mismatches(
    imports: dict[str, dict[str, list[str]]], allowed: dict[str, set[str]]
) -> list[str]:
    """What to change in the table so that it says exactly what each package imports: one line
    each, naming the row to add, the import to add to a row, or the entry to take out."""
    where = f"{ARCHITECTURE.relative_to(ROOT)}, table {TABLE_HEADING.lstrip('# ')!r}"
    wrong = []
    for package in sorted(imports):
        actual = imports[package]
        if package not in allowed:
            wrong.append(
                f"{where}: no row for `{row_name(package)}`; add: {row(package, set(actual))}"
            )
            continue
        for target in sorted(set(actual) - allowed[package]):
            wrong.append(
                f"{where}: `{row_name(package)}` imports `{target}` ({actual[target][0]}), "
                f"which its row does not list: add `{target}` to its last column, or take the "
                f"import out"
            )
        for target in sorted(allowed[package] - set(actual)):
            wrong.append(
                f"{where}: `{row_name(package)}`'s row lists `{target}`, which it does not "
                f"import: take `{target}` out of its last column"
            )
    for package in sorted(set(allowed) - set(imports)):
        wrong.append(f"{where}: the row of `{package}` names no package of batchrun: take it out")
    return wrong


def test_the_walk_sees_function_local_and_relative_imports(tmp_path: Path) -> None:
    """The reader finds an import inside a function and one under TYPE_CHECKING, and resolves a
    relative one."""
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from batchrun.run.jobs import JobSummary\n"
        "def f():\n    from batchrun.serve import jobview\n    from . import records\n"
    )
    known = {
        "batchrun.openai.m": source,
        "batchrun.serve.jobview": source,
        "batchrun.openai.records": source,
        "batchrun.run.jobs": source,
    }
    assert set(imported("batchrun.openai.m", source, known)) == {
        "batchrun.run.jobs",
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
    """Only submit's core (run/jobs.py) and the two faces, the CLI and the Python API (api/),
    know of buckets (storage/), and storage/ imports nothing of batchrun but errors: a job
    never depends on the store."""
    edges = graph()
    users = sorted(
        module
        for module, targets in edges.items()
        if package_of(module) not in ("storage", "cli", "api")
        and any(package_of(t) == "storage" for t in targets)
    )
    assert users == ["batchrun.run.jobs"]
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


def test_the_table_is_read_and_mismatches_say_what_to_change() -> None:
    """The table's reader takes each row's last column; a package without a row is told the row
    to add (its imports filled in), an import not listed and a listed one not made are named."""
    text = (
        f"# x\n\n{TABLE_HEADING}\n\n| package | what | imports |\n|---|---|---|\n"
        "| `run/` | the core | `job`, `errors` |\n| `errors.py` | the error | nothing |\n\nafter\n"
    )
    allowed = table(text)
    assert allowed == {"run": {"job", "errors"}, "errors": set()}
    imports = {
        "run": {
            "job": ["batchrun.run.a -> batchrun.job.b"],
            "config": ["batchrun.run.a -> batchrun.config"],
        },
        "errors": {},
        "new_edge": {"errors": ["batchrun.new_edge.s3 -> batchrun.errors"], "job": ["x -> y"]},
    }
    wrong = table_mismatches(imports, allowed)
    assert len(wrong) == 3, wrong
    assert wrong[0].endswith(
        "no row for `new_edge.py`; add: | `new_edge.py` | <what it is> | `errors`, `job` |"
    )
    assert wrong[1].endswith(
        "`run/` imports `config` (batchrun.run.a -> batchrun.config), which its row does not "
        "list: add `config` to its last column, or take the import out"
    )
    assert wrong[2].endswith(
        "`run/`'s row lists `errors`, which it does not import: take `errors` out of its last "
        "column"
    )
    assert wrong[0].startswith("docs/architecture.md, table 'Packages and what each may import': ")


def test_each_package_imports_exactly_what_its_row_in_the_table_says() -> None:
    """docs/architecture.md's table of packages is the rule: an import a row does not list fails,
    and so does a row that lists an import no longer made (the table drifts no more)."""
    allowed = table(ARCHITECTURE.read_text(encoding="utf-8"))
    wrong = table_mismatches(package_graph(graph()), allowed)
    assert not wrong, "\n".join(["", *wrong])


def test_no_two_packages_import_each_other() -> None:
    """No cycle among packages, in the code nor in the table (each top-level module counted as a
    package of its own)."""
    imports = package_graph(graph())
    assert [sorted(c) for c in cycles({p: set(t) for p, t in imports.items()})] == []
    allowed = table(ARCHITECTURE.read_text(encoding="utf-8"))
    assert [sorted(c) for c in cycles(allowed)] == []
