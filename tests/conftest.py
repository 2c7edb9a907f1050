"""Fixtures and hooks only: an isolated cache, the shared real-engine jobs (session-scoped, one
xdist group each), the marker-driven CLI mode. The helpers the tests import are in tests/support/."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import real_processes
from support.settings import TEST_KV_CACHE_BYTES


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


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures are set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Note whether the test about to run is a real-engine or Ray test: its CLI calls run in
    real processes (support/cli.py)."""
    real_processes.on = any(item.get_closest_marker(m) for m in ("vllm", "ray"))


# --- the real-engine jobs the vLLM tests share (tests/support/vllm_jobs.py) -------------------------
# Session-scoped: each runs once, the first time a test asks for it (tests/support/vllm_jobs.py counts
# the engine starts).


@pytest.fixture(scope="session")
def vllm_chat_job(tmp_path_factory: pytest.TempPathFactory, isolated_cache: Path) -> dict[str, Any]:
    """The chat job (1 engine start): the e2e chat lines, then sample_data/chat_fidelity.jsonl,
    on the default model given as a hub id, resolved offline from a temporary HF_HOME."""
    from support.vllm_jobs import run_chat_job

    (isolated_cache / "batch_sizes.json").unlink(missing_ok=True)  # its batch size is searched
    return run_chat_job(tmp_path_factory.mktemp("vllm-chat"))


@pytest.fixture(scope="session")
def vllm_completions_job(vllm_generative_server: dict[str, Any]) -> dict[str, Any]:
    """The completions job: 32 requests, the e2e completions lines,
    sample_data/completions_fidelity.jsonl; a batch of the generative server, killed with SIGKILL
    in its middle and finished by the server started again on Ray (tests/support/vllm_served.py)."""
    result: dict[str, Any] = vllm_generative_server["completions"]
    return result


@pytest.fixture(scope="session")
def vllm_pooling_server(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One `batchrun serve` on all-MiniLM-L6-v2 (1 engine start): the embeddings, score and rerank
    samples as three batches (tests/support/vllm_served.py)."""
    from support.vllm_served import run_pooling_server

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
    (tests/support/vllm_served.py)."""
    from support.vllm_served import run_generative_server

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
    from support.mm_jobs import build_tiny_models

    return build_tiny_models(isolated_cache)


@pytest.fixture(scope="session")
def vllm_image_job(
    tmp_path_factory: pytest.TempPathFactory, tiny_mm_models: dict[str, Path]
) -> dict[str, Any]:
    """The image job on the tiny Idefics3 (2 engine starts: SIGKILLed, resumed) and raw vLLM's
    answers to its lines (1 start): tests/support/mm_jobs.py."""
    from support.mm_jobs import run_image_job

    return run_image_job(tmp_path_factory.mktemp("vllm-images"), tiny_mm_models)


@pytest.fixture(scope="session")
def vllm_audio_job(
    tmp_path_factory: pytest.TempPathFactory, tiny_mm_models: dict[str, Path]
) -> dict[str, Any]:
    """The transcription job on the tiny Whisper (1 engine start) and vLLM's own batch runner's
    answers to its lines (1 start): tests/support/mm_jobs.py."""
    from support.mm_jobs import run_audio_job

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
