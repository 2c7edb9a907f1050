"""When serve's engine pool leaves its kind (generate or embed; with several models, its model) for
a batch of another kind that comes first in the queue's order (docs/serve-kinds.md).

The decision alone: no I/O, no threads, no clock of its own. The runner tells it the pool's kind,
the first batch's kind and the time (monotonic seconds), under its own lock.
"""

from __future__ import annotations

from collections.abc import Callable

from batchrun.serve.ending import SWEEP_EVERY_S

# A switch of the engine pool between generate and embed batches stops one set of engines and
# starts another (on GPUs, minutes of loading weights). When a batch of the other kind comes
# first in the queue's order, the pool switches as soon as its own kind has no work left
# (nothing pending, nothing in flight): an idle pool holds no batch back. While its kind has
# work (its batches' passes, and new batches of it), it keeps that kind, but no longer than the
# waiting batch has waited `switch_after` (KIND_SWITCH_S: serve/kinds.py): then it takes no new
# work, finishes what it holds and switches. So a long batch of one kind cannot hold off the
# other kind for more than about `switch_after`, and a busy mix of both kinds switches at most
# about once per `switch_after`.


class KindSwitch:
    """Whether the engine pool keeps its kind, or gives way to the kind that comes first."""

    def __init__(self, switch_after: float, check_every: float = SWEEP_EVERY_S) -> None:
        self.switch_after = switch_after
        # `yields` is asked once per request fed: it looks at the queue at most this often.
        self.check_every = check_every
        # Since when a batch of another kind than the pool's has come first in the queue's order.
        self._other_first_since: float | None = None
        self._yielding = False
        self._checked_at: float | None = None

    def new_pool(self) -> None:
        """A pool was just made: no batch has waited for it yet."""
        self._other_first_since, self._yielding = None, False

    def waited(self, kind: str, first: str | None, now: float) -> float | None:
        """How long a batch of another kind than the pool's `kind` has come first in the queue's
        order, `first` being the first feedable batch's kind (None while there is none): None
        while no batch of another kind comes first."""
        if first is None or first == kind:
            self._other_first_since = None
            return None
        if self._other_first_since is None:
            self._other_first_since = now
        return now - self._other_first_since

    def keeps(self, kind: str, first: str | None, has_work: bool, now: float) -> bool:
        """Whether the pool of `kind` runs on: no batch of another kind comes first, or one does
        but `kind` still has work (`has_work`) and that batch has waited less than switch_after."""
        waited = self.waited(kind, first, now)
        if waited is None:
            return True
        return waited < self.switch_after and has_work

    def yields(self, kind: str, first: Callable[[], str | None], now: float) -> bool:
        """Whether the pool of `kind` stops taking new work (it finishes what it holds, then
        switches): a batch of another kind has come first for switch_after. Looked at no more
        than every check_every seconds; `first` (the first feedable batch's kind) is called
        only then."""
        if self._checked_at is None or now - self._checked_at >= self.check_every:
            self._checked_at = now
            waited = self.waited(kind, first(), now)
            self._yielding = waited is not None and waited >= self.switch_after
        return self._yielding
