"""`batchrun serve`: the OpenAI Files and Batches API in front of batchrun's crash-safe jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from batchrun.cli.cache import CacheDir
from batchrun.cli.exits import guarded
from batchrun.cli.options import RayAddress, engine_options
from batchrun.config import GivenOptions


@engine_options(override=False)
def serve(
    ctx: typer.Context,
    root: Annotated[
        Path,
        typer.Option(
            "--root",
            envvar="BATCHRUN_SERVE_ROOT",
            help="Where the server keeps every file and batch (one job directory per batch, under batches/).",
            show_default=False,
        ),
    ],
    host: Annotated[
        str,
        typer.Option(
            "--host", envvar="BATCHRUN_HOST", help="Address to listen on (loopback by default)."
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option("--port", envvar="BATCHRUN_PORT", help="Port to listen on.", min=1, max=65535),
    ] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="BATCHRUN_API_KEY",
            help="Require 'Authorization: Bearer KEY' on every endpoint but /health.",
            show_default=False,
        ),
    ] = None,
    max_file_bytes: Annotated[
        int,
        typer.Option(
            "--max-file-bytes",
            envvar="BATCHRUN_MAX_FILE_BYTES",
            help="Largest upload accepted (413 beyond it).",
            min=1,
        ),
    ] = 200_000_000,
    ray: RayAddress = None,
    cache_dir: CacheDir = None,
    *,
    options: GivenOptions,
) -> None:
    """Serve the OpenAI Files and Batches API: each batch runs as a crash-safe batchrun job
    under --root on one engine pool that stays loaded between batches."""
    from batchrun.run.options import RunOptions
    from batchrun.serve.server import serve as run_serve

    if not str(root).strip():
        raise typer.BadParameter("must name a directory, not be empty", param_hint="--root")
    if api_key is not None and not api_key.strip():
        raise typer.BadParameter("must not be empty", param_hint="--api-key")

    def run() -> None:
        run_options = RunOptions.from_given(options, progress=False, ray=ray)
        if cache_dir is not None:
            from batchrun.run.answer_cache import check_cache_dir

            check_cache_dir(cache_dir)  # before the server starts
            run_options.cache_dir = cache_dir
        run_serve(
            root,
            run_options,
            host=host,
            port=port,
            api_key=api_key,
            max_file_bytes=max_file_bytes,
        )

    guarded(ctx, run)
