"""Admission: which planned requests a worker takes next, so that the prefixes it holds fit the
KV cache of its engine.

vLLM keeps a prompt prefix cached only while its KV cache has room for it. A worker holding the
requests of more distinct prefixes than its cache holds makes them evict each other before their
questions run, and each question computes its document again. So the planned requests are read
ahead (`LOOKAHEAD`), cut into prefix groups (run/prefixes.py), and a worker is handed:

1. the rest of the groups it has open (a group's questions finish before the next is opened);
2. then new groups, in the plan's order, while the prefixes of its open groups, with the
   tokens of their requests' own (the prompt past the prefix, the answer; as many as run at
   once), fit the capacity its engine reported; a worker with nothing open always opens one;
3. then requests that share no prefix, which cost no cached prefix, to keep its batch full:
   within the same budget while it has groups open (their prefixes are what the budget keeps),
   else as many as it takes (vLLM's own scheduler then decides, as without a plan).

Nested prefixes count once: a system prompt shared by every open group is one node of the tree,
held while any of them is open. An engine that reports no capacity (the echo engine) gets every
request in the plan's order, as before.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from batchrun.openai.records import Outcome, Request
from batchrun.run.planner import WINDOW_REQUESTS
from batchrun.run.prefixes import Group, Node, Tail, prefix_tree

# Off unless asked for (BATCHRUN_KV_ADMISSION=1): measured on the CPU machine (docs/benchmarks.md,
# "Dispatch within the KV cache"), the plan alone already reached the best hit rate there (every
# question found its document cached) and this rule, holding fewer requests in the engine than
# vLLM packs itself, halved throughput (workload (a): 48.4 s against 24.4 s, same hit rate).
# Kept, tested and switchable for GPUs with prefixes far larger than the cache, where it is
# still to be measured.
ENV = "BATCHRUN_KV_ADMISSION"


def enabled() -> bool:
    """Whether the user switched the rule on ($BATCHRUN_KV_ADMISSION is 1, true, yes or on)."""
    return os.environ.get(ENV, "").strip().lower() in {"1", "true", "yes", "on"}


# Requests read ahead of dispatch to find groups and requests that share nothing: one planner
# window, so the parent holds at most about twice what the plan alone holds.
LOOKAHEAD = WINDOW_REQUESTS
# Estimated prompt tokens answered before the engine's own counts correct the estimates, and the
# bounds of that correction (a few odd answers must not open the floodgates).
CALIBRATE_AFTER = 4096
MIN_SCALE = 0.25
MAX_SCALE = 4.0


@dataclass
class KvCache:
    """An engine's KV cache as its worker reported it at start-up: tokens, and tokens a block."""

    tokens: int
    block: int


@dataclass(eq=False)
class Lane:
    """One worker's share: the groups it has open, and what it holds (admitted, unanswered)."""

    cache: KvCache | None = None
    window: int = 1
    open: dict[int, Group] = field(default_factory=dict)
    held: dict[int, int] = field(default_factory=dict)  # id(group) -> requests not answered
    count: int = 0  # requests not answered
    prompts: int = 0  # their prompts' own tokens (estimated from characters)
    answers: int = 0  # the tokens they ask for

    def prefix_tokens(self, extra: Group | None = None) -> int:
        """The tokens (estimated from characters) of every distinct prefix its open groups (and
        `extra`) stand on."""
        nodes: dict[int, Node] = {}
        for group in itertools.chain(self.open.values(), [extra] if extra is not None else []):
            for node in group.leaf.chain():
                nodes[id(node)] = node
        return sum(node.tokens for node in nodes.values())

    def fits(self, scale: float, group: Group | None = None, tail: Tail | None = None) -> bool:
        """Whether `group` opened beside the open ones (or one more request of `tail`) leaves
        their prefixes and the running requests' own tokens within the cache; `scale`: real
        prompt tokens per estimated one."""
        if self.cache is None:
            return True
        count, prompts, answers = self.count, self.prompts, self.answers
        if group is not None:
            count += len(group.requests)
            prompts += sum(t.prompt for t in group.tails.values())
            answers += sum(t.answer for t in group.tails.values())
        elif tail is not None:
            count, prompts, answers = count + 1, prompts + tail.prompt, answers + tail.answer
        # At most a window of them runs at once; each rounds up to whole blocks (half a block
        # each, on average).
        running = min(count, self.window)
        own = (prompts * scale + answers) * running / count + running * self.cache.block / 2
        return self.prefix_tokens(group) * scale + (own if count else 0) <= self.cache.tokens


class Admission:
    """Hands out the requests of `source` (in the plan's order) by the rule in this module's
    docstring; told of every answer (`finished`), it closes groups and opens new ones."""

    def __init__(self, source: Iterator[Request], lookahead: int = LOOKAHEAD) -> None:
        self.source = source
        self.lookahead = lookahead
        self._groups: deque[Group] = deque()  # read ahead, not opened yet
        self._alone: deque[Request] = deque()
        self._alone_tails: dict[str, Tail] = {}
        self._source_done = False
        self._lanes: dict[int, Lane] = {}
        # custom_id -> (its lane, its group or None, its own tokens): admitted, not answered.
        self._held: dict[str, tuple[Lane, Group | None, Tail]] = {}
        # Prompt tokens the engine counted, and the estimates from characters of the same
        # prompts: their ratio corrects every estimate once enough answers came (a tokenizer
        # may make 2 characters a token or 7; the chat template adds some).
        self._counted = 0
        self._estimated = 0
        # The most prefix tokens a worker held open at once (estimated, corrected).
        self.peak_prefix_tokens = 0

    @property
    def scale(self) -> float:
        """Real prompt tokens per estimated one, from the answers so far (1 until then)."""
        if self._estimated < CALIBRATE_AFTER:
            return 1.0
        return min(MAX_SCALE, max(MIN_SCALE, self._counted / self._estimated))

    @property
    def exhausted(self) -> bool:
        """Whether every request of the source has been handed out."""
        return (
            self._source_done
            and not self._groups
            and not self._alone
            and not any(g.requests for lane in self._lanes.values() for g in lane.open.values())
        )

    def take(self, lane_id: int, n: int, cache: KvCache | None, window: int) -> list[Request]:
        """Up to `n` requests for worker `lane_id`, whose engine has `cache` (None: unknown, no
        limit) and runs `window` requests at once."""
        lane = self._lanes.get(lane_id)
        if lane is None:
            lane = self._lanes[lane_id] = Lane()
        lane.cache, lane.window = cache, max(1, window)
        scale = self.scale
        out: list[Request] = []
        while len(out) < n:
            for group in lane.open.values():
                self._take_from(lane, group, n, out)
            while self._groups and len(out) < n:
                group = self._groups[0]
                if lane.open and not lane.fits(scale, group=group):
                    break
                self._groups.popleft()
                lane.open[id(group)] = group
                lane.held.setdefault(id(group), 0)
                self.peak_prefix_tokens = max(
                    self.peak_prefix_tokens, round(lane.prefix_tokens() * scale)
                )
                self._take_from(lane, group, n, out)
            while self._alone and len(out) < n:
                tail = self._alone_tails[self._alone[0].custom_id]
                if lane.open and not lane.fits(scale, tail=tail):
                    break  # it would crowd out the open groups' prefixes
                request = self._alone.popleft()
                del self._alone_tails[request.custom_id]
                self._hold(lane, None, request, tail)
                out.append(request)
            # Read further only when nothing is left here: groups waiting for room are waiting
            # for answers, not for more requests (the parent's memory stays bounded).
            if len(out) >= n or self._groups or self._source_done:
                break
            self._read()
        return out

    def _take_from(self, lane: Lane, group: Group, n: int, out: list[Request]) -> None:
        while group.requests and len(out) < n:
            request = group.requests.popleft()
            self._hold(lane, group, request, group.tails.pop(request.custom_id))
            lane.held[id(group)] += 1
            out.append(request)

    def _hold(self, lane: Lane, group: Group | None, request: Request, tail: Tail) -> None:
        self._held[request.custom_id] = (lane, group, tail)
        lane.count += 1
        lane.prompts += tail.prompt
        lane.answers += tail.answer

    def _read(self) -> None:
        """Read the next `lookahead` requests of the source into groups."""
        chunk = list(itertools.islice(self.source, self.lookahead))
        if len(chunk) < self.lookahead:
            self._source_done = True
        if not chunk:
            return
        tree = prefix_tree(chunk)
        self._groups.extend(tree.groups)
        self._alone.extend(tree.alone)
        self._alone_tails.update(tree.alone_tails)

    def finished(self, outcomes: Iterable[Outcome]) -> None:
        """These requests were answered (or failed for good this run): their room is free."""
        for outcome in outcomes:
            held = self._held.pop(outcome.custom_id, None)
            if held is None:
                continue  # not handed out here (a duplicate's copy, an earlier run's)
            lane, group, tail = held
            if outcome.prompt_tokens > 0:
                self._counted += outcome.prompt_tokens
                self._estimated += tail.whole
            lane.count -= 1
            lane.prompts -= tail.prompt
            lane.answers -= tail.answer
            if group is None:
                continue
            left = lane.held[id(group)] - 1
            lane.held[id(group)] = left
            if left == 0 and not group.requests:
                del lane.held[id(group)]
                lane.open.pop(id(group), None)

    def retire(self, lane_id: int) -> None:
        """Worker `lane_id` runs no more: the requests of its open groups not handed out yet go
        to the next worker that opens a group."""
        lane = self._lanes.get(lane_id)
        if lane is None:
            return
        for group in reversed(list(lane.open.values())):
            if group.requests:
                lane.open.pop(id(group))
                fresh = Group(group.leaf, group.requests, group.tails)
                group.requests, group.tails = deque(), {}
                self._groups.appendleft(fresh)
