"""A run's results -> the job's state and journal: the Scheduler's result recording.

Each outcome a worker (or the answer cache) returns is counted in the job's state, turned into its
journal record (with the copies answered for the duplicates held back, run/dedup.py), journaled,
stored in the answer cache once journaled, and added to the run's figures. `Scheduler` takes this
as its base; serve's `SharedScheduler` overrides `_records` and `journal_records`.
"""

from __future__ import annotations

import itertools
import operator
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from batchrun.job.journal import JournalWriter, plain_result
from batchrun.job.records import ResultRecord, result_record
from batchrun.job.state import JobState
from batchrun.openai.records import Outcome, Request
from batchrun.run.admission import Admission
from batchrun.run.answer_cache import AnswerCache
from batchrun.run.dedup import Duplicates
from batchrun.run.reporting import Reporter, RunStats

if TYPE_CHECKING:
    from batchrun.metrics.recorder import RunMetrics

_OK = operator.attrgetter("ok")
_PROMPT_TOKENS = operator.attrgetter("prompt_tokens")
_COMPLETION_TOKENS = operator.attrgetter("completion_tokens")


class ResultRecording:
    """Counts outcomes in the job's state and journals their records (the Scheduler's base)."""

    journal: JournalWriter
    state: JobState
    reporter: Reporter
    duplicates: Duplicates | None
    answers: AnswerCache | None
    _unstored: list[tuple[Outcome, Request]]
    metrics: RunMetrics | None
    admission: Admission | None
    # The name a request's record gives as its model (a job of several models, or adapters:
    # status counts per model, run/model_routes.py); None: records name none.
    record_model: Callable[[Request], str] | None = None

    def _records(
        self,
        pairs: Sequence[tuple[Outcome, Request]],
        index: int | None,
        records: list[ResultRecord],
        outcomes: list[Outcome],
    ) -> bool:
        """Count worker `index`'s outcomes (None: the answer cache's) in the job's state; add them
        and their journal records to `outcomes` and `records`. Return whether they are `plain`
        (see journal.encode_records)."""
        if not pairs:
            return True
        if self.answers is not None:
            self._unstored += pairs  # stored once journaled (copies and hits are skipped)
        now = round(time.time(), 3)
        done = [outcome for outcome, _ in pairs]
        lines = [request.line for _, request in pairs]
        attempts = self.state.record_results(done, index, now, lines)
        plain = True
        for (outcome, request), attempt in zip(pairs, attempts, strict=True):
            rec = result_record(outcome, request.line, attempt, now)
            if index is not None:
                rec["worker"] = index
            if self.record_model is not None:
                rec["model"] = self.record_model(request)
            records.append(rec)
            if plain:
                plain = plain_result(outcome)
        outcomes += done
        if self.duplicates is not None and self.duplicates.held:
            # In the same journal append as their representatives' records: a kill leaves
            # either both or a duplicate with no record, which then simply runs again.
            copies = self.duplicates.answer(pairs)
            if copies:
                self.state.deduplicated += len(copies)
                plain = self._records(copies, index, records, outcomes) and plain
        return plain

    def record_outcome(self, outcome: Outcome, request: Request, index: int) -> ResultRecord:
        """The journal record of one outcome, counted in the job's state."""
        records: list[ResultRecord] = []
        self._records([(outcome, request)], index, records, [])
        return records[0]

    def journal_records(
        self,
        records: list[ResultRecord],
        outcomes: list[Outcome],
        stats: RunStats,
        plain: bool = False,
    ) -> None:
        if not records:
            return
        self.journal.append(records, plain=plain)
        if self._unstored:
            assert self.answers is not None
            # After the journal write: a kill in between leaves an answer journaled, not stored.
            self.answers.store(self._unstored)
            self._unstored = []
        self._count(outcomes, stats)

    def _take(
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
            plain = self._records([(h, by_id[h.custom_id]) for h in hits], None, records, outcomes)
            self.journal_records(records, outcomes, stats, plain)
            if self.metrics is not None:
                self.metrics.from_cache(len(hits))
        return run

    def _count(self, outcomes: list[Outcome], stats: RunStats) -> None:
        """Add journaled outcomes to the run's figures, and tell the reporter."""
        if self.admission is not None:
            self.admission.finished(outcomes)
        succeeded = sum(map(_OK, outcomes))
        prompt = sum(map(_PROMPT_TOKENS, outcomes))
        completion = sum(map(_COMPLETION_TOKENS, outcomes))
        stats.outcomes += len(outcomes)
        stats.succeeded += succeeded
        stats.failed += len(outcomes) - succeeded
        stats.prompt_tokens += prompt
        stats.completion_tokens += completion
        if self.metrics is not None:
            self.metrics.counted(outcomes, succeeded, prompt, completion, self.state.attempts)
        self.reporter.advance(outcomes)
