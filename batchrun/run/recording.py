"""A run's results -> where they are kept: the scheduler's result recording.

Each outcome a worker (or the answer cache) returns goes to the scheduler's `ResultSink`: a job's
run journals it into the job (`JournalSink`: counted in the job's state, turned into its journal
record with the copies answered for the duplicates held back, run/dedup.py, and journaled);
serve's engine pool journals each into its batch's job (serve/router.py `BatchJournals`).
`Recording`, which the scheduler holds, does what is the same for both: the answer cache (looked
up before a request runs, stored once journaled) and the run's figures.
"""

from __future__ import annotations

import itertools
import operator
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from batchrun import timeline
from batchrun.job.journal import JournalWriter, plain_result
from batchrun.job.journal_records import ResultRecord, result_record
from batchrun.job.shards import ShardReader, shards_dir
from batchrun.job.state import JobState
from batchrun.openai.records import Outcome, Request
from batchrun.run.answer_cache import AnswerCache
from batchrun.run.dedup import Duplicates
from batchrun.run.parts import RunFigures
from batchrun.run.reporting import Reporter, RunStats

_OK = operator.attrgetter("ok")
_PROMPT_TOKENS = operator.attrgetter("prompt_tokens")
_COMPLETION_TOKENS = operator.attrgetter("completion_tokens")


class ResultSink(Protocol):
    """Where a scheduler's outcomes are kept."""

    # The duplicates the dispatch plan holds back (run/dedup.py), each answered with its
    # representative's outcome; None: every request runs itself (--order input, or per batch).
    duplicates: Duplicates | None

    def record(
        self,
        pairs: Sequence[tuple[Outcome, Request]],
        index: int | None,
        records: list[ResultRecord],
        outcomes: list[Outcome],
    ) -> bool:
        """Count worker `index`'s outcomes (None: the answer cache's); add them and their
        journal records to `outcomes` and `records`; return whether they are `plain`."""
        ...

    def write(self, records: list[ResultRecord], plain: bool) -> bool:
        """Journal what `record` gave, unless it journaled them itself; False: nothing to
        journal (nothing is stored in the answer cache or counted)."""
        ...

    def attempts(self) -> Mapping[str, int]:
        """Each custom_id's attempts so far (for the metrics' final failures)."""
        ...

    def whole(self, outcomes: Iterable[Outcome]) -> None:
        """Read back the bodies of `outcomes` that their workers wrote to shards
        (job/shards.py), for what needs them in the parent (the answer cache)."""
        ...


def counted_records(
    state: JobState,
    pairs: Sequence[tuple[Outcome, Request]],
    index: int | None,
    now: float,
    record_model: Callable[[Request], str] | None,
) -> tuple[list[Outcome], list[ResultRecord], bool]:
    """Count worker `index`'s outcomes (None: the answer cache's) in the job's state and make
    their journal records, at `now`; returns the outcomes, their records and whether they are
    all `plain` (see journal.encode_records). `record_model`: the name a request's record gives
    as its model (None: records name none)."""
    done = [outcome for outcome, _ in pairs]
    lines = [request.line for _, request in pairs]
    models = [record_model(r) for _, r in pairs] if record_model is not None else None
    attempts = state.record_results(done, index, now, lines, models)
    records: list[ResultRecord] = []
    plain = True
    for i, ((outcome, request), attempt) in enumerate(zip(pairs, attempts, strict=True)):
        rec = result_record(outcome, request.line, attempt, now)
        if index is not None:
            rec["worker"] = index
        if models is not None:  # status counts per model and adapter
            rec["model"] = models[i]
        if outcome.stored is not None:  # its worker wrote the body: the record's last field
            rec["shard"] = outcome.stored
        records.append(rec)
        plain = plain and plain_result(outcome)
    return done, records, plain


class JournalSink:
    """A job's run: each outcome counted in the job's state and journaled into its journal."""

    def __init__(
        self,
        journal: JournalWriter,
        state: JobState,
        duplicates: Duplicates | None = None,
        record_model: Callable[[Request], str] | None = None,
    ) -> None:
        self.journal = journal
        self.state = state
        self.duplicates = duplicates
        # The bodies the workers wrote (job/shards.py), read back only where the parent needs
        # one: a representative's, to answer its duplicates; an answer to store in the cache.
        self.shards = ShardReader(shards_dir(journal.path.parent))
        # The name a request's record gives as its model (a job of several models, or adapters:
        # status counts per model, run/model_routes.py); None: records name none.
        self.record_model = record_model

    def record(
        self,
        pairs: Sequence[tuple[Outcome, Request]],
        index: int | None,
        records: list[ResultRecord],
        outcomes: list[Outcome],
    ) -> bool:
        """Count the outcomes in the job's state; add them and their journal records (and the
        duplicates' copies) to `outcomes` and `records`; return whether they are `plain` (see
        journal.encode_records)."""
        now = round(time.time(), 3)
        done, counted, plain = counted_records(self.state, pairs, index, now, self.record_model)
        records += counted
        outcomes += done
        if self.duplicates is not None and self.duplicates.held:
            held = self.duplicates.held
            for outcome, request in pairs:
                if outcome.stored is not None and request.custom_id in held:
                    self.shards.fill(outcome)  # its record, made above, names the shard still
            # In the same journal append as their representatives' records: a kill leaves
            # either both or a duplicate with no record, which then simply runs again.
            copies = self.duplicates.answer(pairs)
            if copies:  # (counted as copies by the state's fold: job/tally.py)
                plain = self.record(copies, index, records, outcomes) and plain
        return plain

    def write(self, records: list[ResultRecord], plain: bool) -> bool:
        """Append the records to the job's journal."""
        if not records:
            return False
        self.journal.append(records, plain=plain)
        return True

    def attempts(self) -> Mapping[str, int]:
        """The job's attempts so far."""
        return self.state.attempts

    def whole(self, outcomes: Iterable[Outcome]) -> None:
        """Read back the bodies their workers wrote."""
        for outcome in outcomes:
            if outcome.stored is not None:
                self.shards.fill(outcome)

    def close(self) -> None:
        """Close the shards read back."""
        self.shards.close()


class Recording:
    """The scheduler's result recording: its sink, the answer cache, and the run's figures."""

    def __init__(
        self,
        sink: ResultSink,
        reporter: Reporter,
        metrics: RunFigures,
        answers: AnswerCache | None,
        on_counted: Callable[[list[Outcome]], None],
    ) -> None:
        self.sink = sink
        self.reporter = reporter
        self.metrics = metrics
        # Answers reused across jobs (run/answer_cache.py, --cache-dir); None: none. Each model
        # of a job of several has its own (Scheduler.switch_model).
        self.answers = answers
        self._unstored: list[tuple[Outcome, Request]] = []
        # Told of what is journaled before it is counted (the admission's budget, run/admission.py).
        self.on_counted = on_counted

    def records(
        self,
        pairs: Sequence[tuple[Outcome, Request]],
        index: int | None,
        records: list[ResultRecord],
        outcomes: list[Outcome],
    ) -> bool:
        """Count worker `index`'s outcomes (None: the answer cache's) through the sink; add them
        and their journal records to `outcomes` and `records`. Return whether they are `plain`
        (see journal.encode_records)."""
        if not pairs:
            return True
        if self.answers is not None:
            self._unstored += pairs  # stored once journaled (copies and hits are skipped)
        return self.sink.record(pairs, index, records, outcomes)

    def record_outcome(self, outcome: Outcome, request: Request, index: int) -> ResultRecord:
        """The journal record of one outcome, counted in the job's state."""
        records: list[ResultRecord] = []
        self.records([(outcome, request)], index, records, [])
        return records[0]

    def journal_records(
        self,
        records: list[ResultRecord],
        outcomes: list[Outcome],
        stats: RunStats,
        plain: bool = False,
    ) -> None:
        """Journal the records (the sink's way), store the answers, count the outcomes."""
        if not self.sink.write(records, plain):
            return
        if records:
            timeline.mark("first_result")
            timeline.stamp("last_result")
        if self._unstored:
            assert self.answers is not None
            # After the journal write: a kill in between leaves an answer journaled, not stored.
            self.sink.whole(outcome for outcome, _ in self._unstored)
            self.answers.store(self._unstored)
            self._unstored = []
        if outcomes:
            self._count(outcomes, stats)

    def take(
        self, source: Iterator[Request], want: int, stats: RunStats
    ) -> tuple[list[Request], bool]:
        """Up to `want` requests from `source` to run, and whether it ran short (its end): those
        the answer cache answers are journaled here, and more taken in their place."""
        got = list(itertools.islice(source, want))  # one C loop, not one per request
        if self.answers is None:
            return got, len(got) < want
        run: list[Request] = []
        while True:
            short = len(got) < want - len(run)
            run += self._from_cache(got, stats)
            if short or len(run) >= want:
                return run, short
            got = list(itertools.islice(source, want - len(run)))

    def _from_cache(self, requests: list[Request], stats: RunStats) -> list[Request]:
        """Journal the answers the cache holds for `requests`; return the others."""
        assert self.answers is not None
        run, hits = self.answers.lookup(requests)
        if hits:
            by_id = {r.custom_id: r for r in requests}
            records: list[ResultRecord] = []
            outcomes: list[Outcome] = []
            plain = self.records([(h, by_id[h.custom_id]) for h in hits], None, records, outcomes)
            self.journal_records(records, outcomes, stats, plain)
            self.metrics.from_cache(len(hits))
        return run

    def _count(self, outcomes: list[Outcome], stats: RunStats) -> None:
        """Add journaled outcomes to the run's figures, and tell the reporter."""
        self.on_counted(outcomes)
        succeeded = sum(map(_OK, outcomes))
        prompt = sum(map(_PROMPT_TOKENS, outcomes))
        completion = sum(map(_COMPLETION_TOKENS, outcomes))
        stats.outcomes += len(outcomes)
        stats.succeeded += succeeded
        stats.failed += len(outcomes) - succeeded
        stats.prompt_tokens += prompt
        stats.completion_tokens += completion
        self.metrics.counted(outcomes, succeeded, prompt, completion, self.sink.attempts())
        self.reporter.advance(outcomes)
