"""`batchrun` as the tests run it: in this process (`cli`, `run_cli`: the fast tier's way), or in
a real process (`cli_process`, `start_cli`: signals, exits, process trees, and every call of a
vllm or ray test)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

from support.paths import ROOT

# `on` while a vllm or ray test runs (its shared session jobs included): those keep real
# processes, as before (tests/conftest.py's pytest_runtest_setup sets it). Their time is the
# engines' and Ray's (an engine start is 10-15 CPU-s against the 0.25 a process adds), and
# in-process they would be one more thing to prove.
real_processes = SimpleNamespace(on=False)


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run `batchrun ARGS` in this process (run_cli): for every test where the process itself is
    not what is tested. `cli_process` runs a real one (signals, exits, process trees, the entry
    point's own set-up, variables a library reads at import), as does every call of a vllm or
    ray test; BATCHRUN_TEST_CLI=process sends every call there. `timeout` bounds a process only."""
    if real_processes.on or os.environ.get("BATCHRUN_TEST_CLI") == "process":
        return cli_process(*args, env=env, timeout=timeout)
    return run_cli(*args, env=env)


def cli_process(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    unset: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """Run `python -m batchrun ARGS` in a real subprocess: this process's environment without
    `unset`, `env` over it."""
    full_env = {k: v for k, v in os.environ.items() if k not in unset} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "batchrun", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=ROOT,
        timeout=timeout,
    )


_COMMAND: list[Any] = []  # the CLI's click command, built once (run_cli)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `batchrun ARGS` in this process through click's CliRunner, as `python -m batchrun` would
    run them in a process of its own (about 0.2 CPU-s less each: 0.18 against 0.001 for a `status`): the same program name, cwd
    and environment, an uncaught exception's traceback on stderr with exit 1, and afterwards
    what the process's exit would have undone, undone (its workers killed, its CPU core claim
    given up, the environment, working directory, sys.argv, signal handlers, stop state and
    batchrun's process-wide caches as they were).
    Not the entry point's stop handlers nor its output guards: a test of those runs a process."""
    import traceback

    from click.testing import CliRunner

    runner = CliRunner()
    if not _COMMAND:
        # Imported inside the runner's streams: the CLI's rich consoles decide on colour when
        # they are made, and a real process's stdout here is a pipe, not the terminal.
        with runner.isolation():
            import typer.main

            from batchrun.cli import app

            _COMMAND.append(typer.main.get_command(app))
    from batchrun import stopping
    from batchrun.openai import media
    from batchrun.workers import cpu_claims, devices, gpu_release, process

    # Process-wide state a command sets, which a process of its own would start without: the
    # media policy of the job it read, nvidia-smi's inventory (read again after 10 s, and a test
    # may change its fake in less), the GPUs' memory before this process's first engine.
    saved_state = (media._policy, dict(devices._CACHE), dict(gpu_release._BASELINES))
    devices._CACHE.clear()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    groups, children = set(process._GROUPS), set(multiprocessing.active_children())
    saved_argv = sys.argv
    sys.argv = [str(ROOT / "batchrun" / "__main__.py"), *args]  # as `python -m batchrun` has it
    os.chdir(ROOT)
    # The CLI's rich consoles are made once, at their first import in this process, and one made
    # while COLUMNS was set keeps that width: a process of its own reads this call's COLUMNS.
    from batchrun.cli import exits

    for console in (exits.out, exits.err):
        console._width = console._height = None
    try:
        result = runner.invoke(
            _COMMAND[0], list(args), env=env, prog_name="python -m batchrun", catch_exceptions=True
        )
    finally:
        # What the exit of a process would do: kill the workers it left (workers/process.py's
        # exit handler), give up its cores (workers/cpu_claims.py's).
        kill_new_workers(groups, children)
        cpu_claims.release_claim()
        media._policy, cached, baselines = saved_state
        devices._CACHE.clear()
        devices._CACHE.update(cached)
        gpu_release._BASELINES.clear()
        gpu_release._BASELINES.update(baselines)
        stopping._first = stopping._job_dir = stopping._again = stopping._resume = None
        stopping._retry = False
        for sig, handler in saved_signals.items():
            signal.signal(sig, handler)
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert result.exc_info is not None
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess(["batchrun", *args], result.exit_code, result.stdout, stderr)


def kill_new_workers(groups: set[int], children: set[Any]) -> None:
    """What a process's exit does to the workers it started (workers/process.py's exit handler):
    kill the process groups and children that are not among `groups` and `children`, those
    this process had before."""
    from batchrun.workers import process, process_group

    for pgid in set(process._GROUPS) - groups:
        process_group.kill_group(pgid)
        process._GROUPS.discard(pgid)
    for child in set(multiprocessing.active_children()) - children:
        child.kill()
        child.join(timeout=5)


def start_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start `python -m batchrun ARGS` in its own process group (so it can be killed whole)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "batchrun", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        cwd=ROOT,
        start_new_session=True,
    )


def error_line(stderr: str) -> str:
    """The one `error: ` line a failed command printed (the test fails if there is not one)."""
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr
    return lines[0]


def run_python(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python ARGS` (a script of the checkout, a module) in a process of its own, from ROOT."""
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout
    )
