"""`--help` reads whole in an 80-column terminal, for every command: no name cut with '…', the
help text never squeezed under 30 columns, `INPUT_FILE` (not `{INPUT_FILE}`) in the usage line.
And `job dir: ...` is said only once a job exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from support.paths import ROOT

from batchrun.cli import app

BATCHRUN = Path(sys.executable).parent / "batchrun"
WIDTH = 80
MIN_HELP = 30  # columns the help text keeps at the least


def command_paths(group: Any = None, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command as the words that name it, subcommands of a group (`cache stats`) too."""
    group = group if group is not None else typer.main.get_command(app)
    paths = []
    for name in sorted(group.list_commands(None)):
        command = group.get_command(None, name)
        paths.append((*prefix, name))
        if hasattr(command, "list_commands"):
            paths.extend(command_paths(command, (*prefix, name)))
    return paths


COMMANDS = [" ".join(path) for path in command_paths()]
# An option name as click declares it: "--name", "-n", and "--x / --no-x" both sides.
OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def help_text(*args: str) -> str:
    """`batchrun ARGS --help` as a person sees it in an 80-column terminal."""
    env = {**os.environ, "COLUMNS": str(WIDTH), "LINES": "50", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    r = subprocess.run(
        [str(BATCHRUN), *args, "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def declared_names(command: str) -> set[str]:
    """Every option name the command declares (click's own list)."""
    cmd: Any = typer.main.get_command(app)
    for word in command.split():
        cmd = cmd.get_command(None, word)
    names: set[str] = {"--help"}
    for param in cmd.params:
        if param.param_type_name == "option":
            names.update(param.opts)
            names.update(param.secondary_opts)
    return names


def test_commands_are_found() -> None:
    """The test covers every command, the ones added later too."""
    assert {"submit", "tune", "resume", "retry-failed", "export", "status", "serve"} <= set(
        COMMANDS
    )


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_reads_whole_at_80_columns(command: str) -> None:
    text = help_text(*command.split())
    lines = text.splitlines()
    assert "…" not in text
    assert "{" not in lines[0], lines[0]  # usage: INPUT_FILE, not {INPUT_FILE}
    # A metavar names what to give, never a Python name (typer names one after its parser).
    assert not re.search(r"<_\w*>", text), re.findall(r"<_\w*>", text)
    for line in lines:
        assert len(line) <= WIDTH, line
        # A help line of a two-column list: its text starts where the help column starts.
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        if indent > 2:  # a continuation line, or a help line under a long name
            assert WIDTH - indent >= MIN_HELP, line
        elif indent == 2 and stripped.startswith("-"):
            gap = re.search(r"\S  +(\S)", stripped)
            if gap:  # the name and its help on one line
                assert WIDTH - (indent + gap.start(1)) >= MIN_HELP, line
    if command:
        shown = set()
        for line in lines:
            if line.startswith("  -"):  # the names of an option row
                names = re.split(r"\s{2,}", line.strip())[0]
                shown.update(OPTION.findall(names))
        assert shown == declared_names(command)


def test_usage_names_the_input_file_plainly() -> None:
    for command in ("submit", "tune"):
        assert help_text(command).splitlines()[0] == (
            f"Usage: batchrun {command} [OPTIONS] INPUT_FILE"
        )


def test_option_panels_are_kept() -> None:
    """The engine options are a group of their own, as before."""
    assert "Engine options (replace the job's):" in help_text("resume").splitlines()
    assert "Engine options:" in help_text("submit").splitlines()


def test_job_dir_is_said_only_once_the_job_exists(tmp_path: Path) -> None:
    """A refusal before the job is made (here: no such input file) names no job directory."""
    job = tmp_path / "j"
    r = subprocess.run(
        [str(BATCHRUN), "submit", str(tmp_path / "missing.jsonl"), "--job-dir", str(job)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 1
    assert "job dir" not in r.stderr
    assert not job.exists()
