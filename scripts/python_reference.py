"""Write the Python API's reference into docs/python.md from the docstrings and signatures of
batchrun.run, batchrun.submit, batchrun.Job and batchrun.BatchrunError, between
`<!-- python-reference -->` and its closing marker; `--check` only says whether the page is up
to date (tests/test_python_api.py runs it so).

    .venv/bin/python scripts/python_reference.py           # rewrite the section
    .venv/bin/python scripts/python_reference.py --check   # exit 1 when it is out of date
"""

from __future__ import annotations

import argparse
import inspect
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "python.md"
START, END = "<!-- python-reference -->", "<!-- /python-reference -->"


def signature(name: str, function: Callable[..., Any]) -> str:
    """`name(params) -> returns`, the parameters' defaults shown, their types left to the text."""
    sig = inspect.signature(function)
    params = []
    star = False
    for p in sig.parameters.values():
        if p.name == "self":
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            params.append("*")
            star = True
        if p.kind is p.VAR_KEYWORD:
            params.append(f"**{p.name}")
        elif p.default is p.empty:
            params.append(p.name)
        else:
            params.append(f"{p.name}={p.default!r}")
    returns = sig.return_annotation
    shown = "" if returns is sig.empty else f" -> {returns}"
    return f"{name}({', '.join(params)}){shown}"


def entry(name: str, function: Callable[..., Any]) -> list[str]:
    """One function's heading and its docstring."""
    doc = inspect.cleandoc(function.__doc__ or "")
    return [f"### `{signature(name, function)}`", "", doc, ""]


def options_table() -> list[str]:
    """The engine options the functions take (`**options`), with their types."""
    from batchrun.api.options import EngineOptions, flag

    hints = typing.get_type_hints(EngineOptions)
    lines = [
        "### `**options`: the engine options",
        "",
        inspect.cleandoc(EngineOptions.__doc__ or ""),
        "",
        "| option | type | the CLI's flag |",
        "|---|---|---|",
    ]
    for name, hint in hints.items():
        shown = str(hint).replace("typing.", "")
        for kind in ("str", "int", "float", "bool"):
            shown = shown.replace(f"<class '{kind}'>", kind)
        shown = shown.replace("|", "\\|")  # inside a table cell, code included
        lines.append(f"| `{name}` | `{shown}` | `{flag(name)}` |")
    return [*lines, ""]


def reference() -> str:
    """The section's text."""
    import batchrun
    from batchrun.api.job import Job

    lines = [
        "## API reference",
        "",
        "Generated from the docstrings by `scripts/python_reference.py`.",
        "",
        *entry("batchrun.run", batchrun.api.run),
        *entry("batchrun.submit", batchrun.submit),
        "### `batchrun.Job(job_dir)`",
        "",
        inspect.cleandoc(Job.__doc__ or ""),
        "",
    ]
    for method in ("status", "resume", "retry_failed", "results", "to_pandas", "export", "report"):
        lines += entry(f"Job.{method}", getattr(Job, method))
    lines += [
        "### `batchrun.BatchrunError`",
        "",
        inspect.cleandoc(batchrun.BatchrunError.__doc__ or ""),
        "",
        "From Python it is raised with that message (a bad option's: the CLI's line, "
        "`Invalid value for '--batch-size' ...`); `exit_code` says what the CLI would exit "
        "with (2: a usage error).",
        "",
        *options_table(),
    ]
    return "\n".join(lines).rstrip() + "\n"


def page_with(text: str, section: str) -> str:
    """The page with its reference section replaced."""
    i, j = text.index(START), text.index(END)
    return text[: i + len(START)] + "\n" + section + "\n" + text[j:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check the page")
    args = parser.parse_args(argv)
    text = PAGE.read_text(encoding="utf-8")
    wanted = page_with(text, reference())
    if args.check:
        if wanted != text:
            print(f"{PAGE} is out of date: run scripts/python_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(wanted, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
