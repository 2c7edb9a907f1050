"""Advice followed as printed: the `batchrun ...` commands a line names, read back and run, so
that a test checks the advice does what it says rather than that it reads a certain way."""

from __future__ import annotations

import re
import shlex
import subprocess

from support.cli import cli

# A command in back-quotes, or one after "... with: " (or the ", then " that names a second one)
# up to ", or ...", ", then ..." or the end of the line.
_QUOTED = re.compile(r"`(batchrun [^`]+)`")
_AFTER_COLON = re.compile(r"(?:with:|, then) (batchrun .+?)(?=, or |, then |\.?$)", re.M)


def advised(text: str) -> list[list[str]]:
    """The commands `text` advises, in order, each as its argv without `batchrun`."""
    found = [m.group(1) for m in _QUOTED.finditer(text)]
    if not found:
        found = [m.group(1) for m in _AFTER_COLON.finditer(text)]
    return [shlex.split(c)[1:] for c in found]


def follow(
    command: list[str], *extra: str, env: dict[str, str] | None = None, **fill: str
) -> subprocess.CompletedProcess[str]:
    """Run an advised command as printed (its placeholders, such as N, given in `fill`), with
    `extra` options that change nothing of what it does (--no-progress)."""
    argv = [fill.get(arg, arg) for arg in command]
    return cli(*argv, *extra, env=env)


def last_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The advice after the summary table: stdout's last line."""
    return proc.stdout.rstrip("\n").splitlines()[-1]
