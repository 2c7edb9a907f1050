"""A value given from Python made into the one the CLI's parser makes of the same flag: converted
through the click parameter the CLI's command declares (its type, range, choices and callback),
so that a bad value is refused in the CLI's own line (`Invalid value for '--batch-size' (env
var: 'BATCHRUN_BATCH_SIZE'): 0 is not in the range 1<=x<=2048.`), word for word.

The line is click's `BadParameter.format_message()` (Typer's own copy of click): the text the
CLI prints in its error panel (under its usage lines, which are decoration). It names the
option's environment variable where the command reads one, as the CLI's does, even though the
Python API reads none: one line for one mistake, whichever way it was made.
"""

from __future__ import annotations

import typing
from typing import Any

from batchrun.config import OptionError
from batchrun.options.option import Option


class CliLine(OptionError):
    """A bad option value whose message is already the CLI's whole line."""


def cli_value(option: Option, value: Any, *, override: bool) -> Any:
    """`value` (given, not None) as the CLI's parser makes it for `option` on a command that
    replaces the job's options (`override`: resume, retry-failed) or not (submit). A value the
    parser could never be given (a string for a number) is refused first, in the same form.

    Raises:
        CliLine: the value is refused; its message is the CLI's line.
    """
    import typer
    from typer.core import TyperCommand

    param, convertor = option.click_param(override=override)
    ctx = typer.Context(TyperCommand(None))
    try:
        _check_kind(option, value)
        given = tuple(value) if param.multiple else value
        converted = param.process_value(ctx, given)
    except typer.BadParameter as e:
        # What click's parser adds to a callback's error (click.core.augment_usage_errors).
        e.ctx = e.ctx or ctx
        e.param = e.param or param
        raise CliLine(option.flag, e.format_message(), exit_code=e.exit_code) from None
    return convertor(converted) if convertor is not None else converted


def _check_kind(option: Option, value: Any) -> None:
    """Refuse a value of a kind the CLI's parser could never have made for this option: click
    would take "8" for 8, and True for 1."""
    import typer

    kind = typing.get_origin(option.type) or option.type
    if kind is bool:
        ok, what = isinstance(value, bool), "true or false"
    elif kind is int:
        ok, what = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif kind is float:
        ok, what = isinstance(value, int | float) and not isinstance(value, bool), "a number"
    elif kind is list:
        ok = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
        what = "a string or a list of strings"
    else:  # a string, or one of a Literal's strings
        ok, what = isinstance(value, str), "a string"
    if not ok:
        raise typer.BadParameter(f"must be {what}, got {value!r}")
