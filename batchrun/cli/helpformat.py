"""--help that reads whole in an 80-column terminal, for every command.

Typer's rich help puts names, metavars and help in one table that rich squeezes to fit: at 80
columns it cut option names with '…' and left the help 16 columns. Here help is click's plain
two-column list instead (a name longer than the first column puts its help on the next line, so
the help always keeps at least half the width), grouped into the same panels as before
("Engine options", ...). Errors keep Typer's rich panel: only the help is plain.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import typer
from typer._click.core import Context, Parameter
from typer._click.formatting import HelpFormatter
from typer.core import TyperCommand, TyperGroup

# Rich markup escapes in help texts ("\\[default: ...]") are literal brackets in plain help.
_RICH_ESCAPE = re.compile(r"\\\[")
# Typer's usage shows a required argument as {NAME}; the usual convention is NAME.
_REQUIRED = re.compile(r"^\{(.+)\}$")
_OTHER_OPTIONS = "Options"
# Typer's metavars, shortened: the range itself is in the help text ("1<=x<=2048").
_METAVARS = {"<int range>": "<int>", "<float range>": "<float>", "<Path>": "<path>"}


def _plain(text: str) -> str:
    """A help text with rich's escapes undone."""
    return _RICH_ESCAPE.sub("[", text)


def _records(ctx: Context, params: list[Parameter]) -> list[tuple[str, str]]:
    """The (names, help) rows of `params`, as click writes them, in plain text."""
    rows = []
    for param in params:
        record = param.get_help_record(ctx)
        if record is not None:
            names = record[0]
            for long, short in _METAVARS.items():
                names = names.replace(long, short)
            rows.append((names, _plain(record[1])))
    return rows


def _format_help(
    command: TyperCommand | TyperGroup, ctx: Context, formatter: HelpFormatter
) -> None:
    """click's plain help (Typer's own format_help would hand it to rich)."""
    command.format_usage(ctx, formatter)
    command.format_help_text(ctx, formatter)
    command.format_options(ctx, formatter)
    command.format_epilog(ctx, formatter)


class HelpCommand(TyperCommand):
    """A Typer command whose --help is click's plain layout, grouped by help panel."""

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        """Usage, the command's help, then its arguments and each panel of options."""
        _format_help(self, ctx, formatter)

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        """The usage line's pieces, required arguments as NAME (not {NAME})."""
        return [_REQUIRED.sub(r"\1", piece) for piece in super().collect_usage_pieces(ctx)]

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        """Arguments, then the options without a panel, then each panel in order of first use."""
        params = self.get_params(ctx)
        arguments = [p for p in params if p.param_type_name == "argument"]
        panels: dict[str, list[Parameter]] = {_OTHER_OPTIONS: []}
        for param in params:
            if param.param_type_name == "option":
                panel = getattr(param, "rich_help_panel", None) or _OTHER_OPTIONS
                panels.setdefault(panel, []).append(param)
        for title, group in (("Arguments", arguments), *panels.items()):
            rows = _records(ctx, group)
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


class HelpGroup(TyperGroup):
    """The `batchrun` group: plain help, each command with the whole first paragraph of its own."""

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        """Usage, the tool's help, its options and its commands."""
        _format_help(self, ctx, formatter)

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        """The group's options, then its commands."""
        rows = _records(ctx, self.get_params(ctx))
        if rows:
            with formatter.section(_OTHER_OPTIONS):
                formatter.write_dl(rows)
        self.format_commands(ctx, formatter)

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        """Every command with the first paragraph of its help, never cut short."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            first = inspect.cleandoc(command.help or "").split("\n\n")[0]
            rows.append((name, _plain(" ".join(first.split()))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


# How every command group of ours behaves (typer_app).
_GROUP_SETTINGS: dict[str, Any] = {
    "no_args_is_help": True,
    "add_completion": False,
    "pretty_exceptions_enable": False,
    "context_settings": {"max_content_width": 400},
}


def typer_app(name: str, help: str) -> typer.Typer:
    """A command group of ours: plain help (HelpGroup), as wide as the terminal (click would stop
    at 80; this module keeps it whole at 80), shown when no command is given; no shell-completion
    options, no rich tracebacks (an error is one line of ours)."""
    return typer.Typer(name=name, help=help, cls=HelpGroup, **_GROUP_SETTINGS)
