"""Shared fixtures: an isolated cache, the CLI run in this process or in a real one, input-file
builders."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from batchrun.job.vectors import VectorReader, inline

ROOT = Path(__file__).resolve().parent.parent
# The KV cache of every engine the tests start (see isolated_cache).
TEST_KV_CACHE_BYTES = 1 << 30


def _share_cores_between_test_processes() -> None:
    """Under pytest-xdist each test process may run a CPU engine at the same time as another:
    give each engine its share of the cores, as a user running two jobs on one machine would.
    batchrun's default gives one engine every core; two such engines' OpenMP threads stall each
    other (the suite took 4:44 so, 3:52 with one thread each, on 2 cores)."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if count > 1 and "OMP_NUM_THREADS" not in os.environ and hasattr(os, "sched_getaffinity"):
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // count))


_share_cores_between_test_processes()


def _share_converted_models(cache: Path, shared: Path) -> None:
    """The converted models (the default model's conversion: about 30 CPU seconds) in one place
    for every test process of this run, their conversion lock with them: a conversion is
    serialised by a flock on `<cache>/.models.lock` (batchrun/models/convert.py), so the lock
    file is shared too, and the second process finds the first's conversion done."""
    models, lock = shared / "shared-models", shared / "shared-models.lock"
    models.mkdir(exist_ok=True)
    lock.touch()
    (cache / "models").symlink_to(models, target_is_directory=True)
    (cache / ".models.lock").symlink_to(lock)


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """No test touches the user's cache: each test process has its own, whose converted models
    are shared by the run's processes (the default model is converted once per run)."""
    cache = tmp_path_factory.mktemp("batchrun-cache")
    saved = {k: os.environ.get(k) for k in ("BATCHRUN_HOME",)}
    os.environ["BATCHRUN_HOME"] = str(cache)
    for key in list(os.environ):
        # A developer's own BATCHRUN_* settings must not leak into the tests: among them
        # BATCHRUN_CACHE_DIR, which would give every test the answer cache (--cache-dir).
        if key.startswith("BATCHRUN_") and key != "BATCHRUN_HOME":
            del os.environ[key]
    # The tests' CPU core claims (workers/cpu_claims.py) apart from the developer's own jobs',
    # and one place for every test process of this run, so that their engines take cores apart.
    # (Under pytest-xdist each process's base temp is a popen-gwN folder of the run's own.)
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base
    os.environ["BATCHRUN_CPU_CLAIMS_DIR"] = str(shared / "cpu-claims")
    _share_converted_models(cache, shared)
    # Each test engine's KV cache: 1 GiB (--kv-cache-memory-bytes; a command line's own wins),
    # not vLLM's share of the machine's memory (0.4 on a CPU: 9.6 GB here). Two test processes
    # with an engine each, beside a raw vLLM to compare with, took most of the 24 GB and failed
    # starts for memory; and an engine zeroed its 9.6 GB at every start. Measured on the sample
    # job: started in 14.7 s against 27.3, peak 1.8 GB against 7.1 (sys 1.7 s against 16.5).
    os.environ["BATCHRUN_KV_CACHE_MEMORY_BYTES"] = str(TEST_KV_CACHE_BYTES)
    yield cache
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def fresh_size_cache(isolated_cache: Path) -> None:
    """Each test starts without a remembered batch size, so that searches are deterministic."""
    (isolated_cache / "batch_sizes.json").unlink(missing_ok=True)


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run `batchrun ARGS` in this process (run_cli): for every test where the process itself is
    not what is tested. `cli_process` runs a real one (signals, exits, process trees, the entry
    point's own set-up, variables a library reads at import), as does every call of a vllm or
    ray test; BATCHRUN_TEST_CLI=process sends every call there. `timeout` bounds a process only."""
    if _REAL_PROCESSES or os.environ.get("BATCHRUN_TEST_CLI") == "process":
        return cli_process(*args, env=env, timeout=timeout)
    return run_cli(*args, env=env)


# True while a vllm or ray test runs (its shared session jobs included): those keep real
# processes, as before. Their time is the engines' and Ray's (an engine start is 10-15 CPU-s
# against the 0.25 a process adds), and in-process they would be one more thing to prove.
_REAL_PROCESSES = False


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures are set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Note whether the test about to run is a real-engine or Ray test (see `cli`)."""
    global _REAL_PROCESSES
    _REAL_PROCESSES = any(item.get_closest_marker(m) for m in ("vllm", "ray"))


def cli_process(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run `python -m batchrun ARGS` in a real subprocess."""
    full_env = {**os.environ, **(env or {})}
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
    from batchrun.workers import cpu_claims, devices, gpu_release, process, process_group

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
        for pgid in set(process._GROUPS) - groups:
            process_group.kill_group(pgid)
            process._GROUPS.discard(pgid)
        for child in set(multiprocessing.active_children()) - children:
            child.kill()
            child.join(timeout=5)
        cpu_claims.release_claim()
        media._policy, cached, baselines = saved_state
        devices._CACHE.clear()
        devices._CACHE.update(cached)
        gpu_release._BASELINES.clear()
        gpu_release._BASELINES.update(baselines)
        stopping._first = stopping._job_dir = stopping._again = stopping._resume = None
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


def wait_until(
    condition: Callable[[], object], what: str, timeout: float = 120, every: float = 0.05
) -> None:
    """Poll `condition` until it holds; fail the test, saying `what` never happened, on time-out
    (a wait that runs out silently lets a test go on to assert on the wrong moment)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting until {what}")
        time.sleep(every)


def results_at_least(job: Path, n: int) -> Callable[[], bool]:
    """A condition: the job's journal holds at least `n` records."""
    return lambda: (job / "journal.jsonl").exists() and len(journal_records(job)) >= n


def chat_line(cid: str, text: str, **body: Any) -> dict[str, Any]:
    """One chat request line."""
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "test-model", "messages": [{"role": "user", "content": text}], **body},
    }


def model_line(cid: str, model: str | None) -> dict[str, Any]:
    """A short chat line naming `model` in body.model (None: naming none)."""
    line = chat_line(cid, f"text of {cid}", max_tokens=4)
    if model is None:
        del line["body"]["model"]
    else:
        line["body"]["model"] = model
    return line


def write_jsonl(path: Path, lines: list[Any]) -> Path:
    """Write objects (or raw strings) as JSONL."""
    with path.open("w", encoding="utf-8") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL file."""
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


@contextlib.contextmanager
def reference_run(command: list[str], log: Path) -> Iterator[Callable[[], str]]:
    """Run a reference (raw vLLM) in a process of its own beside the test's job, its stderr in
    `log`; yield a function that waits for it and returns its stdout, failing with the end of
    its log if it failed. A test that gives up first kills it."""
    out_path = log.with_suffix(".stdout")
    with log.open("w") as err, out_path.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=err, cwd=ROOT, start_new_session=True)

    def finish() -> str:
        proc.wait(timeout=900)
        assert proc.returncode == 0, log.read_text()[-3000:]
        return out_path.read_text()

    try:
        yield finish
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def journal_records(job_dir: Path) -> list[dict[str, Any]]:
    """The job's journal records: its whole lines (one being written while a job runs is not
    one yet, as the journal's own reader says), their vectors in their bodies."""
    data = (job_dir / "journal.jsonl").read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    # Each line with its vectors back from the side file (job/vectors.py): the record as an
    # earlier version wrote it, its embeddings base64 in the body.
    with VectorReader(job_dir / "journal.jsonl") as vectors:
        return [json.loads(inline(x + b"\n", vectors)) for x in whole.split(b"\n") if x.strip()]


def worker_pids(parent_pid: int) -> list[int]:
    """The engine worker processes of a batchrun process (they are named batchrun-worker)."""
    found = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(parent_pid).children():
            with contextlib.suppress(psutil.Error):
                if "batchrun-worker" in " ".join(child.cmdline()):
                    found.append(child.pid)
    return found


def group_alive(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    alive = []
    for p in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                alive.append(p.pid)
    return alive


# --- the real-engine jobs the vLLM tests share (tests/vllm_jobs.py) -------------------------
# Session-scoped: each runs once, the first time a test asks for it (tests/vllm_jobs.py counts
# the engine starts).


@pytest.fixture(scope="session")
def vllm_chat_job(tmp_path_factory: pytest.TempPathFactory, isolated_cache: Path) -> dict[str, Any]:
    """The chat job (1 engine start): the e2e chat lines, then sample_data/chat_fidelity.jsonl,
    on the default model given as a hub id, resolved offline from a temporary HF_HOME."""
    from vllm_jobs import run_chat_job

    (isolated_cache / "batch_sizes.json").unlink(missing_ok=True)  # its batch size is searched
    return run_chat_job(tmp_path_factory.mktemp("vllm-chat"))


@pytest.fixture(scope="session")
def vllm_completions_job(vllm_generative_server: dict[str, Any]) -> dict[str, Any]:
    """The completions job: 32 requests, the e2e completions lines,
    sample_data/completions_fidelity.jsonl; a batch of the generative server, killed with SIGKILL
    in its middle and finished by the server started again on Ray (tests/vllm_served.py)."""
    result: dict[str, Any] = vllm_generative_server["completions"]
    return result


@pytest.fixture(scope="session")
def vllm_pooling_server(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One `batchrun serve` on all-MiniLM-L6-v2 (1 engine start): the embeddings, score and rerank
    samples as three batches (tests/vllm_served.py)."""
    from vllm_served import run_pooling_server

    return run_pooling_server(tmp_path_factory.mktemp("vllm-pooling"))


@pytest.fixture(scope="session")
def vllm_embeddings_job(vllm_pooling_server: dict[str, Any]) -> dict[str, Any]:
    """The embeddings job: sample_data/embeddings.jsonl, a batch of the pooling server."""
    result: dict[str, Any] = vllm_pooling_server["embeddings"]
    return result


@pytest.fixture(scope="session")
def vllm_generative_server(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`batchrun serve` on the default model with a thinking chat template and
    --reasoning-parser qwen3 (2 engine starts): the completions job, the responses job and its
    reasoning lines again; killed with SIGKILL, then started again on Ray
    (tests/vllm_served.py)."""
    from vllm_served import run_generative_server

    return run_generative_server(tmp_path_factory.mktemp("vllm-generative"))


@pytest.fixture(scope="session")
def vllm_responses_job(vllm_generative_server: dict[str, Any]) -> dict[str, Any]:
    """The responses job: sample_data/responses.jsonl and reasoning lines (/v1/responses), a
    batch of the generative server."""
    result: dict[str, Any] = vllm_generative_server["responses"]
    return result


@pytest.fixture(scope="session")
def tiny_mm_models(isolated_cache: Path) -> dict[str, Path]:
    """The tiny Idefics3 and Whisper (scripts/testmodels/multimodal.py), built once for the run."""
    from mm_jobs import build_tiny_models

    return build_tiny_models(isolated_cache)


@pytest.fixture(scope="session")
def vllm_image_job(
    tmp_path_factory: pytest.TempPathFactory, tiny_mm_models: dict[str, Path]
) -> dict[str, Any]:
    """The image job on the tiny Idefics3 (2 engine starts: SIGKILLed, resumed) and raw vLLM's
    answers to its lines (1 start): tests/mm_jobs.py."""
    from mm_jobs import run_image_job

    return run_image_job(tmp_path_factory.mktemp("vllm-images"), tiny_mm_models)


@pytest.fixture(scope="session")
def vllm_audio_job(
    tmp_path_factory: pytest.TempPathFactory, tiny_mm_models: dict[str, Path]
) -> dict[str, Any]:
    """The transcription job on the tiny Whisper (1 engine start) and vLLM's own batch runner's
    answers to its lines (1 start): tests/mm_jobs.py."""
    from mm_jobs import run_audio_job

    return run_audio_job(tmp_path_factory.mktemp("vllm-audio"), tiny_mm_models)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (scripts/test.sh), keep the tests of each vLLM job in one process, so
    that each session-scoped job starts once, and the Ray tests together (one local Ray at a
    time)."""
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(pytest.mark.xdist_group(_engine_group(item)))
        elif item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.xdist_group("ray"))


# The session-scoped real-engine jobs, each the group of the tests that read it: a group runs in
# one test process, so each job starts its engines once, and the groups spread over the
# processes (one group of them all ran 7 minutes of engine starts in a row in one process). The
# tiny media models (7 s to build) are built once, by the first process that needs them.
ENGINE_JOB_GROUPS = {
    "vllm_generative_server": "vllm-generative",
    "vllm_image_job": "vllm-images",
    "vllm_audio_job": "vllm-audio",
    "vllm_pooling_server": "vllm-pooling",
    "vllm_chat_job": "vllm-chat",
}


def _engine_group(item: pytest.Item) -> str:
    """The xdist group of a real-engine test: its shared job's, else its module's."""
    names = getattr(item, "fixturenames", ())  # fixtures' own included
    for fixture, group in ENGINE_JOB_GROUPS.items():
        if fixture in names:
            return group
    return "vllm-" + Path(str(item.fspath)).stem


@pytest.fixture(scope="session")
def vllm_score_job(vllm_pooling_server: dict[str, Any]) -> dict[str, Any]:
    """The score job: sample_data/score.jsonl (/v1/score), a batch of the pooling server."""
    result: dict[str, Any] = vllm_pooling_server["score"]
    return result


@pytest.fixture(scope="session")
def vllm_rerank_job(vllm_pooling_server: dict[str, Any]) -> dict[str, Any]:
    """The rerank job: sample_data/rerank.jsonl (/v1/rerank), a batch of the pooling server."""
    result: dict[str, Any] = vllm_pooling_server["rerank"]
    return result


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The power-loss tests' figures (crash points, cuts, seeds: tests/test_powerloss.py), said
    at the end of every run that ran them, passed or not (under xdist too: the reports carry
    them as user properties)."""
    lines = [
        f"{report.nodeid.split('::')[-1]}: {value}"
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for key, value in getattr(report, "user_properties", [])
        if key == "powerloss"
    ]
    if lines:
        terminalreporter.write_sep("-", "power cuts")
        for line in sorted(lines):
            terminalreporter.write_line(line)
