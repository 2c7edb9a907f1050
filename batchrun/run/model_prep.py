"""The model a job runs, checked before each run: --model, --revision, --tokenizer and the name
answers report (batchrun/models/ says what a --model value may be)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from batchrun.config import EngineSettings, OptionError
from batchrun.errors import BatchrunError
from batchrun.run.options import Notify


def prepare_model(settings: EngineSettings, notify: Notify) -> None:
    """Find the model before a job exists (and again on every resume), and set the name answers
    report: a hub id is looked up in the Hugging Face cache (downloading only its config.json
    when online) and its commit kept for the workers; a directory is checked; a .gguf file, or
    the embedded default model, is converted once in a child process, so that this process, the
    journal's owner, never imports torch or transformers."""
    from batchrun import models

    served = settings.served_model_name
    if settings.spec.model == "remote":
        _prepare_remote(settings, notify)
        return
    if settings.spec.model == "none":
        if settings.revision is not None:  # accepted and ignored, it would mislead
            raise OptionError(
                "--revision",
                f"the {settings.engine} engine loads no model, so a revision means nothing to "
                "it; leave --revision out",
            )
        settings.model_name = served or _echo_name(settings.model)
        return
    kind = models.model_kind(settings.model)
    if settings.revision is not None and kind != "hub":
        what = {"directory": "a local directory", "gguf": "a local GGUF file"}
        raise OptionError(
            "--revision",
            "applies to a Hugging Face hub id only, "
            + (
                f"and --model {settings.model} is {what[kind]}"
                if settings.model
                else "and no --model names one"
            ),
        )
    if settings.tokenizer is not None:
        settings.tokenizer = models.check_tokenizer(settings.tokenizer)
    settings.model_commit = None
    if kind == "hub":
        assert settings.model is not None
        snapshot = models.resolve_hub(settings.model, settings.revision)
        settings.model_commit = snapshot.commit
        name = settings.model
    elif kind == "directory":
        assert settings.model is not None
        directory = models.check_directory(settings.model)
        settings.model, name = str(directory), directory.name
    elif kind == "gguf":
        assert settings.model is not None
        gguf = models.check_gguf(settings.model)
        settings.model, name = str(gguf), gguf.stem
        if not models.gguf_model_ready(gguf):
            _convert_in_child(notify, f"converting {gguf.name} once", [str(gguf)])
    else:
        if not models.default_model_ready():
            models.packaged_gguf()  # a clear message when the package is missing
            _convert_in_child(notify, "converting the embedded default model once (about 20 s)", [])
        name = models.DEFAULT_MODEL_NAME
    settings.model_name = served or name


def _prepare_remote(settings: EngineSettings, notify: Notify) -> None:
    """The server at --base-url checked (reachable, OpenAI's JSON, the key taken, the model
    served), and the model a line naming none is sent with: a BatchrunError in one line, before
    any job exists (engines/remote/probe.py)."""
    from batchrun.engines.remote.probe import probe, served_model

    for option, value in (
        ("--model", settings.model),
        ("--revision", settings.revision),
        ("--tokenizer", settings.tokenizer),
    ):
        if value is not None:
            raise OptionError(
                option,
                "means nothing to the remote engine: the server at --base-url loads its model; "
                "name the model lines are sent with by --served-model-name",
            )
    assert settings.base_url is not None  # checked with the options
    server = probe(settings.base_url)
    settings.model_name = served_model(server, settings.served_model_name)
    listed = ", ".join(server.models) or "no model"
    notify(f"server {settings.base_url}: serves {listed}")


def _echo_name(model: str | None) -> str:
    """The name a model-less engine reports for --model: a path's last part, or a hub id."""
    if model is None:
        return "echo"
    path = Path(model).expanduser()
    return path.name if path.exists() else model


def _convert_in_child(notify: Notify, what: str, args: list[str]) -> None:
    """Run `python -m batchrun.models ARGS`: torch and transformers load in the child only."""
    notify(f"{what}...")
    proc = subprocess.run(
        [sys.executable, "-m", "batchrun.models", *args], capture_output=True, text=True
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
        raise BatchrunError(f"could not prepare the model: {last}")
