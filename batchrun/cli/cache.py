"""`--cache-dir` (answers reused across jobs) and `batchrun cache stats|prune`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from batchrun.cli.exits import fail
from batchrun.cli.helpformat import HelpCommand, typer_app
from batchrun.errors import BatchrunError

CacheDir = Annotated[
    Path | None,
    typer.Option(
        "--cache-dir",
        envvar="BATCHRUN_CACHE_DIR",
        help="Reuse answers across jobs: a deterministic request (temperature 0 or a fixed seed) answered before by the same model is journaled from DIR without running; new answers are stored there. A job keeps the one it was submitted with.",
        show_default=False,
        metavar="DIR",
    ),
]

app = typer_app("cache", "See and bound a --cache-dir of answers reused across jobs.")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """`30d`, `12h`, `90m`, `45s` or plain seconds, in seconds."""
    text = text.strip().lower()
    unit = _UNITS.get(text[-1:]) if text else None
    number = text[:-1] if unit is not None else text
    try:
        value = float(number) * (unit or 1)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not an age such as 30d, 12h, 90m or 45s") from None
    if value < 0:
        raise typer.BadParameter(f"{text!r} is negative")
    return value


CacheRoot = Annotated[
    Path,
    typer.Option(
        "--cache-dir", envvar="BATCHRUN_CACHE_DIR", help="The cache directory.", metavar="DIR"
    ),
]


@app.command("stats", cls=HelpCommand)
def stats(
    cache_dir: CacheRoot,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Show how many answers the cache holds, their size and age."""
    from batchrun.run.answer_cache import stats as cache_stats

    _check(cache_dir)
    s = cache_stats(cache_dir)
    if as_json:
        sys.stdout.write(json.dumps(s) + "\n")
        return
    sys.stdout.write(f"{s['entries']} answers, {s['bytes']} bytes in {s['dir']}\n")


@app.command("prune", cls=HelpCommand)
def prune(
    cache_dir: CacheRoot,
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            help="Remove answers stored longer ago than this (30d, 12h, 90m, 45s).",
            metavar="AGE",
        ),
    ],
) -> None:
    """Remove answers stored longer ago than --older-than."""
    from batchrun.run.answer_cache import prune as cache_prune

    age = parse_age(older_than)
    _check(cache_dir)
    count, size = cache_prune(cache_dir, age)
    sys.stdout.write(f"removed {count} answers ({size} bytes) from {cache_dir}\n")


def _check(cache_dir: Path) -> None:
    """A --cache-dir that is not an answer cache: one line, exit 2."""
    from batchrun.run.answer_cache import check_existing_cache

    try:
        check_existing_cache(cache_dir)
    except BatchrunError as e:
        fail(str(e), e.exit_code)
