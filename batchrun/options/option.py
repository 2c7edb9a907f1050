"""`Option`: one command-line option, declared once for the commands that take it; its Typer
parameter (the CLI's) and its click parameter (what the Python API converts a value through)
are both made of it, so that they cannot differ."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from batchrun.config import OptionError

if TYPE_CHECKING:
    from typer.core import TyperOption

# The help panel of the engine options, and the one resume and retry-failed show them in.
ENGINE_PANEL = "Engine options"
OVERRIDE_PANEL = "Engine options (replace the job's)"


@dataclass(frozen=True)
class Option:
    """One option: its name (the parameter's; the flag is --name-with-dashes), its value's type
    (Typer takes choices from a Literal, ranges from min/max) and what its help says.

    An engine option (`replaces`) replaces the job's own value on resume and retry-failed; there
    it is a flag only, with no environment variable: a BATCHRUN_* variable left set in a shell
    must not change a job behind its owner's back. Any other option reads its variable on every
    command.
    """

    name: str
    type: Any
    help: str
    default: str | None = None  # what the help shows as the default (the value given is None)
    decls: tuple[str, ...] = ()
    min: int | float | None = None
    max: int | float | None = None
    callback: Callable[[Any], Any] | None = None
    metavar: str | None = None
    panel: str = ENGINE_PANEL
    replaces: bool = True

    @property
    def flag(self) -> str:
        """The option's long flag (`batch_size` -> `--batch-size`)."""
        return "--" + self.name.replace("_", "-")

    @property
    def checked_by_parser(self) -> bool:
        """Whether click itself checks the value: a range, or a list of choices."""
        return self.min is not None or self.max is not None or is_choice(self.type)

    def envvar(self, *, override: bool) -> str | None:
        """The environment variable the command reads it from (none for an engine option that
        replaces the job's own)."""
        return None if override and self.replaces else f"BATCHRUN_{self.name.upper()}"

    def info(self, *, override: bool) -> Any:
        """Its `typer.Option(...)`, as a command declares it."""
        import typer

        shown = f" \\[default: {self.default}]" if self.default and not override else ""
        panel = OVERRIDE_PANEL if override and self.replaces else self.panel
        return typer.Option(
            *self.decls,
            envvar=self.envvar(override=override),
            help=self.help + shown,
            show_default=False,
            min=self.min,
            max=self.max,
            callback=self.callback,
            metavar=self.metavar,
            rich_help_panel=panel,
        )

    def parameter(self, *, override: bool) -> inspect.Parameter:
        """The command's parameter. Left out, it is None: the default (submit), or the job's
        own value (resume)."""
        return inspect.Parameter(
            self.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[self.type | None, self.info(override=override)],
        )

    def click_param(self, *, override: bool) -> tuple[TyperOption, Callable[[Any], Any] | None]:
        """The click parameter Typer makes of it for a command (type, range, choices,
        environment variable and callback all the CLI's), and Typer's convertor of its value."""
        from typer.main import get_click_param
        from typer.utils import get_params_from_function

        def command() -> None: ...

        command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [self.parameter(override=override)]
        )
        (meta,) = get_params_from_function(command).values()
        param, convertor = get_click_param(meta)
        return param, convertor  # type: ignore[return-value]


def is_choice(kind: Any) -> bool:
    """Whether a value's type is a list of choices (a Literal)."""
    return typing.get_origin(kind) is typing.Literal


def checked(check: Callable[[Any], object]) -> Callable[[Any], Any]:
    """A callback running a core check on the value given: an OptionError is a usage error, in
    click's words (`Invalid value for '--flag': ...`)."""

    def callback(value: Any) -> Any:
        if value is not None:
            try:
                check(value)
            except OptionError as e:
                raise bad_value(str(e)) from e
        return value

    return callback


def bad_value(message: str) -> Exception:
    """The error a callback raises for a bad value: the usage error of Typer's click, which
    names the option it checks (Typer imported only when a value is refused)."""
    import typer

    return typer.BadParameter(message)
