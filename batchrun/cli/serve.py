"""`batchrun serve`: the OpenAI Files and Batches API in front of batchrun's crash-safe jobs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from batchrun.cli.cache import CacheDir
from batchrun.cli.exits import guarded
from batchrun.cli.options import RayAddress, engine_options
from batchrun.config import GivenOptions
from batchrun.options.metrics import GPU_HOUR_COST

# serve's --gpu-hour-cost: the same option as submit's, pricing each batch's runs.
_COST = dataclasses.replace(
    GPU_HOUR_COST,
    help="USD per GPU-hour (per machine-hour on a CPU): each batch's cost in its job's status "
    "and report, over every run of it (a killed server's included). Remembered by the root.",
).info(override=False)


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
        str | None,
        typer.Option(
            "--host",
            envvar="BATCHRUN_HOST",
            help="Address to listen on: 127.0.0.1 (loopback) unless the root remembers another; "
            "any other address needs --api-key.",
            show_default=False,
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            envvar="BATCHRUN_PORT",
            help="Port to listen on: 8000 unless the root remembers another.",
            min=1,
            max=65535,
            show_default=False,
        ),
    ] = None,
    api_key: Annotated[
        list[str] | None,
        typer.Option(
            "--api-key",
            envvar="BATCHRUN_API_KEY",
            help="Require 'Authorization: Bearer KEY' on every endpoint but /health; repeat it "
            "for several tenants (each key sees only its own files and batches). Kept in the "
            "root as a salted hash only.",
            show_default=False,
        ),
    ] = None,
    api_keys_file: Annotated[
        Path | None,
        typer.Option(
            "--api-keys-file",
            envvar="BATCHRUN_API_KEYS_FILE",
            help="Tenants' keys, one 'NAME KEY' (or 'KEY') a line; read again on SIGHUP.",
            show_default=False,
        ),
    ] = None,
    max_file_bytes: Annotated[
        int | None,
        typer.Option(
            "--max-file-bytes",
            envvar="BATCHRUN_MAX_FILE_BYTES",
            help="Largest upload accepted (413 beyond it): 200000000 unless the root remembers "
            "another.",
            min=1,
            show_default=False,
        ),
    ] = None,
    gpu_hour_cost: Annotated[float | None, _COST] = None,
    ray: RayAddress = None,
    cache_dir: CacheDir = None,
    *,
    options: GivenOptions,
) -> None:
    """Serve the OpenAI Files and Batches API: each batch runs as a crash-safe batchrun job
    under --root on one engine pool that stays loaded between batches. The root remembers how
    it was started: `batchrun serve --root DIR` alone starts it the same way again."""
    from batchrun.serve.server import serve as run_serve
    from batchrun.serve.settings import Given

    if not str(root).strip():
        raise typer.BadParameter("must name a directory, not be empty", param_hint="--root")
    if api_key is not None and any(not k.strip() for k in api_key):
        raise typer.BadParameter("must not be empty", param_hint="--api-key")

    def run() -> None:
        if cache_dir is not None:
            from batchrun.run.answer_cache import check_cache_dir

            check_cache_dir(cache_dir)  # before the server starts
        given = Given(
            options,
            host=host,
            port=port,
            max_file_bytes=max_file_bytes,
            ray=ray,
            cache_dir=cache_dir,
            api_keys=[k.strip() for k in api_key] if api_key else None,
            api_keys_file=api_keys_file,
            gpu_hour_cost=gpu_hour_cost,
        )
        run_serve(root, given)

    guarded(ctx, run)
