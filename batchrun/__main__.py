"""Entry point (`batchrun` and `python -m batchrun`): signal handling first, then the CLI.

The handlers go in before the CLI's modules load (typer, rich: a tenth of a second), so that a
Ctrl-C at any moment exits 130 with no traceback.
"""

from batchrun import stopping
from batchrun.console import streams


def main() -> None:
    """Install the stop handlers and the output guards, then run the command line."""
    stopping.install()
    streams.guard_std_streams()
    try:
        from batchrun.cli import main as cli_main
    except KeyboardInterrupt:
        raise SystemExit(stopping.exit_code() or stopping.EXIT_INTERRUPTED) from None
    cli_main()


if __name__ == "__main__":
    main()
