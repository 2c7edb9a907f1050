"""The command line: parse options, call one core function, turn errors into exit codes.

Never imports vLLM (the engine lives in worker processes), so `--help` is instant.
`options`: the options the commands share and the engine option table; `report`: output, errors
and exit codes; `jobs`: submit, tune, resume, retry-failed; `results`: export, status.
"""

from __future__ import annotations

from batchrun import stopping
from batchrun.cli.cache import app as cache_app
from batchrun.cli.doctor import doctor
from batchrun.cli.helpformat import HelpCommand, typer_app
from batchrun.cli.jobs import resume, retry_failed, submit, tune
from batchrun.cli.report import report
from batchrun.cli.results import export, status
from batchrun.cli.serve import serve
from batchrun.stopping import EXIT_INTERRUPTED

app = typer_app(
    "batchrun", "Run OpenAI Batch API JSONL files through vLLM on your own GPUs, crash-safe."
)
for _name, _command in (
    ("submit", submit),
    ("tune", tune),
    ("resume", resume),
    ("retry-failed", retry_failed),
    ("export", export),
    ("status", status),
    ("report", report),
    ("serve", serve),
    ("doctor", doctor),
):
    app.command(_name, cls=HelpCommand)(_command)
app.add_typer(cache_app, name="cache")


def main() -> None:
    """Console entry point."""
    stopping.install()
    try:
        app()
    except SystemExit as e:
        # Typer turns a KeyboardInterrupt that escapes a command (a SIGTERM before the command's
        # own handler is in place, say) into exit 130: give a SIGTERM its own code.
        code = stopping.exit_code()
        if code is not None and e.code == EXIT_INTERRUPTED:
            raise SystemExit(code) from None
        raise
    except KeyboardInterrupt:  # one that came outside Typer's own handling
        raise SystemExit(stopping.exit_code() or EXIT_INTERRUPTED) from None


__all__ = ["app", "main"]
