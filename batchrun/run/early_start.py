"""A new job's engine started while its input is validated.

On a GPU an engine's start (weights, CUDA graphs) takes 30-120 s, and validating a file of
millions of lines takes seconds to minutes: one after the other, both are on the critical path.
The workers' start does not depend on what validation finds but for two things, both known
before: the endpoint (a pooling model for embeddings, score and rerank), read from the file's
first valid line (every valid line has the same one: openai/reader.py), and the batch size the
first pass starts at (a fixed one, a cached one, or the top of the search). So `submit` starts
the workers first, validates, and hands them to the run, which takes them as its own
(`Scheduler(started=...)`); a refusal or a Ctrl-C during validation stops them with the job.

Not started early, where the first start could be the wrong one or none may be needed: a Ray
cluster (its actors are placed by the run), several base models (the first pass's model is
chosen after validation), an answer cache (it may answer every line: then no engine starts at
all), or a file whose first lines hold no valid request.

`resume` and `retry-failed` do the same with what comes before their run once the input is
found unchanged: the journal's replay, seconds a million lines. They start early when the job's
saved summary says the run has work (a request with no finished attempt; a failed one) and the
job runs as it ran (no option given, no new or forced input): otherwise the replay decides, as
before.
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from batchrun.config import EngineSettings
from batchrun.job.manifest import Manifest, find_input
from batchrun.job.paths import JobPaths
from batchrun.job.shards import shards_dir
from batchrun.job.summary import saved_summary
from batchrun.openai.reader import read_input
from batchrun.openai.records import Request
from batchrun.run.options import RunOptions
from batchrun.run.restarts import start_events
from batchrun.run.source import InputIndex
from batchrun.run.tuning import cached_size
from batchrun.workers.devices import cache_device, search_ceiling
from batchrun.workers.messages import Inbox
from batchrun.workers.plan import plan_workers
from batchrun.workers.process import Worker

# How far into the file the endpoint is looked for: a file whose first lines are all invalid
# validates first and starts its engine after, as before.
PEEK_LINES = 1000


@dataclass
class StartedWorkers:
    """Workers started before the run, with what the run needs to take them over."""

    worker_class: type[Worker]
    envs: list[dict[str, str]]
    workers: list[Worker]
    inbox: Inbox

    def fits(self, settings: EngineSettings) -> bool:
        """Whether the workers run what `settings` (as validation left them) ask for."""
        return all(
            dataclasses.replace(
                settings, max_num_seqs=w.settings.max_num_seqs, window=w.settings.window
            )
            == w.settings
            for w in self.workers
        )

    def stop(self) -> None:
        """Stop every worker at once: the job was refused, or its run cannot use them."""
        for w in self.workers:
            w.kill()


def start_early(
    input_path: Path,
    paths: JobPaths,
    options: RunOptions,
    index: InputIndex,
    say: Callable[[str], None],
    *,
    search: bool = False,
    size: int | None = None,
) -> StartedWorkers | None:
    """Start the job's workers now, as the run would start them; None where it does not (see
    the module's docstring). `search`: the run searches afresh (`tune`), from the top; `size`:
    the job's own batch size, which the run takes first (run/passes._choose_size)."""
    settings = options.settings
    if options.ray or options.cache_dir is not None or settings.models:
        return None
    endpoint = first_endpoint(input_path, index)
    if endpoint is None:
        return None
    settings = dataclasses.replace(settings, endpoint=endpoint)
    worker_class, envs = plan_workers(
        settings,
        ray=None,
        gpus=options.gpus,
        workers=options.workers,
        logs=paths.logs,
        shards=shards_dir(paths.root),
    )
    if search:
        size = search_top(options, settings, envs)
    elif not size:
        size = first_size(options, settings, envs)
    inbox: Inbox = queue.Queue()
    started = StartedWorkers(worker_class, envs, [], inbox)
    try:
        for i, env in enumerate(envs):
            w = worker_class(
                index=i,
                settings=dataclasses.replace(settings, max_num_seqs=size, window=size),
                env=dict(env),
            )
            w.start(inbox)
            started.workers.append(w)
            for line in start_events(w):
                say(f"[batchrun] {line}")
    except BaseException:
        started.stop()
        raise
    return started


def start_continued_early(
    paths: JobPaths,
    manifest: Manifest,
    options: RunOptions,
    index: InputIndex,
    say: Callable[[str], None],
    *,
    retry: bool,
) -> StartedWorkers | None:
    """Start the workers of a resumed job (`retry`: of retry-failed) before its journal is
    replayed, when its saved summary says there is work; None where it does not (see the
    module's docstring). The caller has refused a job whose run options changed."""
    summary = saved_summary(paths, manifest)
    if summary is None:
        return None
    work = summary.failed if retry else summary.pending(manifest.requests)
    input_path = find_input(paths, manifest)
    if work <= 0 or input_path is None:
        return None
    return start_early(input_path, paths, options, index, say, size=manifest.batch_size)


def first_endpoint(input_path: Path, index: InputIndex) -> str | None:
    """The url of the file's first valid request within its first lines, or None."""
    items = read_input(
        input_path, index.known, index.vocab
    )  # a generator: closed, its file with it
    try:
        for item in itertools.islice(items, PEEK_LINES):
            if isinstance(item, Request):
                return item.url
    except (OSError, UnicodeError, ValueError):
        return None  # validation says what is wrong with the file
    finally:
        items.close()  # type: ignore[attr-defined]  # typed as an Iterator there
    return None


def first_size(
    options: RunOptions, settings: EngineSettings, envs: Sequence[Mapping[str, str]]
) -> int:
    """The batch size the run's first pass starts its engines at (run/passes._choose_size):
    the fixed one, one an earlier job found on this set-up, or the top of the search."""
    if options.batch_size:
        return options.batch_size
    cached = cached_size(settings, cache_device(settings.spec, envs))
    if cached is not None:
        return cached
    return search_top(options, settings, envs)


def search_top(
    options: RunOptions, settings: EngineSettings, envs: Sequence[Mapping[str, str]]
) -> int:
    """Where the batch-size search starts: --max-batch-size, else vLLM's own default for the
    workers' GPUs, at least the floor."""
    if options.max_batch is not None:
        return options.max_batch
    return max(options.min_batch, search_ceiling(settings.spec, envs))
