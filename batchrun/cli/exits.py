"""What the commands print and how they end: the consoles, the one-line error, the summary, and
every error of a core function mapped to its exit code (2 usage, 1 error, 130/143 on a stop)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from batchrun import stopping
from batchrun.config import OptionError
from batchrun.errors import BatchrunError, GaveUp
from batchrun.stopping import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated

if TYPE_CHECKING:
    from batchrun.console.render import JobSummary

T = TypeVar("T")

out = Console()
err = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """One line on stderr, then exit `code`."""
    # The message is escaped: a path or a value with "[...]" in it must print as it is.
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def say(line: str) -> None:
    """A line on stderr, as it is (what the runner says before a run)."""
    err.print(line, highlight=False, markup=False, soft_wrap=True)


def plain(line: str) -> None:
    """A line on stdout, as it is."""
    out.print(line, highlight=False, markup=False, soft_wrap=True)


def _bad_option(ctx: typer.Context, e: OptionError) -> NoReturn:
    """A bad value given is a usage error, shown as Typer shows its own (exit 2); a bad value
    the job saved is a one-line error (exit 1) that names the option replacing it."""
    if e.exit_code == 2:
        raise typer.BadParameter(str(e), ctx=ctx, param_hint=list(e.options))
    fail(str(e), e.exit_code)


def _interrupted(exc: KeyboardInterrupt) -> NoReturn:
    """Say how to go on after Ctrl-C or SIGTERM (the job was named with stopping.set_job)."""
    what = "terminated" if isinstance(exc, Terminated) else "interrupted"
    exists, next_command = stopping.next_command()
    if exists:
        message = f"the journal is flushed; nothing finished is lost. Continue with: {next_command}"
    else:
        message = f"stopped before the job was created; run it again with: {next_command}"
    err.print(f"\n[bold yellow]{what}:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED)


def guarded(ctx: typer.Context, call: Callable[[], T]) -> T:
    """Run a job command's core function: a bad option is a usage error (or a one-line error
    for one the job saved), any other error a line and its exit code, a stop says how to go on."""
    try:
        return call()
    except OptionError as e:
        _bad_option(ctx, e)
    except GaveUp as e:
        # The Ctrl-C advice's command: resume, or retry-failed for what a retry left failed.
        _, then = stopping.next_command()
        fail(f"{e}; once the cause is fixed, continue with: {then}", e.exit_code)
    except BatchrunError as e:
        fail(str(e), e.exit_code)
    except KeyboardInterrupt as e:
        _interrupted(e)


def finish(summary: JobSummary, title: str) -> NoReturn:
    """The summary table and the advice after it; exit with the job's code."""
    from batchrun.console.render import next_step, print_summary

    print_summary(out, summary, title)
    plain(next_step(summary))
    raise typer.Exit(summary.exit_code)
