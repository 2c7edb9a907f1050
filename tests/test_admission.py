"""The planner's admission (run/admission.py): a worker holds only the prefixes its KV cache holds.

In process, no engine: a fake engine with a small LRU prefix cache (whole blocks, as vLLM's)
counts the prefix blocks it computes again after evicting them.
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from support.fakes.workers import Events, answered, begin
from support.jobs import journal_records, submit_echo
from support.lines import chat_line, write_jsonl

from batchrun.config import EngineSettings
from batchrun.job.journal import JournalWriter, read_records
from batchrun.job.state import JobState
from batchrun.openai.records import CHAT, Outcome, Request
from batchrun.run import admission as admission_module
from batchrun.run.admission import Admission, KvCache
from batchrun.run.dedup import Duplicates
from batchrun.run.planner import order_window, plan, prompt_text
from batchrun.run.prefixes import CHARS_PER_TOKEN, prefix_tree
from batchrun.run.recording import JournalSink
from batchrun.run.scheduler import Scheduler
from batchrun.workers.messages import Inbox, Ready
from batchrun.workers.process import Worker

BLOCK = 16  # tokens a block in the fake engine
WORDS = [
    "river",
    "city",
    "market",
    "light",
    "garden",
    "winter",
    "music",
    "engine",
    "harbor",
    "forest",
    "letter",
    "window",
]


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def chat(cid: str, messages: list[tuple[str, str]], max_tokens: int = 16) -> Request:
    body = {
        "model": "m",
        "messages": [{"role": role, "content": content} for role, content in messages],
        "max_tokens": max_tokens,
    }
    return Request(cid, 1, CHAT, body)


def documents(
    docs: int, questions: int, system: str | None = None, seed: int = 1, alone: int = 0
) -> list[Request]:
    """`docs` documents of ~400 words x `questions` questions (after `system`, if given), plus
    `alone` prompts that share nothing; shuffled."""
    rng = random.Random(seed)
    out = []
    for d in range(docs):
        doc = text(rng, 400)
        for q in range(questions):
            messages = [("user", f"{doc}\n\nQuestion {q}: {rng.choice(WORDS)}?")]
            if system is not None:
                messages.insert(0, ("system", system))
            out.append(chat(f"d{d}-q{q}", messages))
    for i in range(alone):
        out.append(chat(f"alone-{i}", [("user", f"{i} {text(rng, 30)}")]))
    rng.shuffle(out)
    return out


@dataclass
class Running:
    """A request in the fake engine: its prompt's blocks, its own blocks, its age in steps."""

    request: Request
    keys: list[str]
    private: int = 1
    age: int = 0


class FakeEngine:
    """vLLM's prefix cache in small. A prompt is cut into blocks of BLOCK tokens
    (CHARS_PER_TOKEN characters each), keyed by everything up to their end; a block in use is
    held, a free one stays cached until it is the least recently freed and a new block needs its
    place. Up to `window` requests run; the next waiting one (in arrival order) starts when its
    blocks and one of its own fit. Each step every running request ages; at `GROW` it needs one
    more block of its own (its answer crossing a block), and when none is left the newest running
    request is preempted (its blocks freed, back to the front of the queue), as vLLM does; at
    `LENGTH` it finishes. `recomputed` counts a document's blocks computed again after an
    eviction (a preempted prompt that shares nothing is vLLM's own business, with or without a
    plan)."""

    GROW = 2
    LENGTH = 4

    def __init__(self, tokens: int, window: int) -> None:
        self.blocks = tokens // BLOCK
        self.window = window
        self.used: dict[str, int] = {}  # block key -> running requests holding it
        self.free: OrderedDict[str, None] = OrderedDict()  # cached, evictable, LRU first
        self.computed: set[str] = set()
        self.recomputed = 0
        self.preempted = 0
        self.waiting: deque[Request] = deque()
        self.running: list[Running] = []
        self.peak_running = 0

    @staticmethod
    def keys(request: Request) -> list[str]:
        t = prompt_text(request)
        size = BLOCK * CHARS_PER_TOKEN
        return [t[: (i + 1) * size] for i in range(len(t) // size)]

    def add(self, requests: list[Request]) -> None:
        self.waiting.extend(requests)

    def _held(self) -> int:
        return len(self.used) + sum(r.private for r in self.running)

    def _new_block(self) -> bool:
        """Room for one more block: an empty one, else the least recently freed cached one."""
        if self._held() + len(self.free) < self.blocks:
            return True
        if self.free:
            self.free.popitem(last=False)
            return True
        return False

    def _admit(self, request: Request) -> bool:
        keys = self.keys(request)
        needed = sum(1 for k in keys if k not in self.used) + 1  # + one of its own
        if needed > self.blocks - self._held():
            return False
        for k in keys:  # cached blocks first, so that making room cannot evict them
            if k in self.used:
                self.used[k] += 1
            elif k in self.free:
                del self.free[k]
                self.used[k] = 1
        for k in keys:
            if k not in self.used:
                assert self._new_block()
                if k in self.computed and not request.custom_id.startswith("alone"):
                    self.recomputed += 1  # a document's block: what the admission protects
                self.computed.add(k)
                self.used[k] = 1
        assert self._new_block()
        self.running.append(Running(request, keys))
        return True

    def _release(self, r: Running) -> None:
        for k in r.keys:
            self.used[k] -= 1
            if self.used[k] == 0:
                del self.used[k]
                self.free[k] = None

    def step(self) -> list[str]:
        while self.waiting and len(self.running) < self.window and self._admit(self.waiting[0]):
            self.waiting.popleft()
        self.peak_running = max(self.peak_running, len(self.running))
        for r in list(self.running):
            if r not in self.running:
                continue  # preempted meanwhile
            r.age += 1
            if r.age == self.GROW:
                while not self._new_block():
                    victim = self.running.pop()
                    self._release(victim)
                    self.waiting.appendleft(victim.request)
                    self.preempted += 1
                    if victim is r:
                        break
                else:
                    r.private += 1
        finished = [r for r in self.running if r.age >= self.LENGTH]
        for r in finished:
            self.running.remove(r)
            self._release(r)
        return [r.request.custom_id for r in finished]


def drive(
    requests: list[Request], engine: FakeEngine, feed: Callable[[int], list[Request]], room: int
) -> list[str]:
    """Run the fake engine, topping it up from `feed` to `room` held requests (the scheduler's
    window plus prefetch); return the custom_ids in the order they finished."""
    done: list[str] = []
    held = 0
    for _ in range(100_000):
        batch = feed(room - held)
        held += len(batch)
        engine.add(batch)
        finished = engine.step()
        held -= len(finished)
        done += finished
        if len(done) == len(requests):
            return done
        if not finished and not batch and held == 0:
            break
    raise AssertionError(f"stalled after {len(done)} of {len(requests)}")


def run_plain(requests: list[Request], tokens: int, window: int) -> FakeEngine:
    """Today's dispatch: the plan's order, a worker's window plus prefetch held at once."""
    engine = FakeEngine(tokens, window)
    planned = iter(order_window(requests))

    def feed(n: int) -> list[Request]:
        return [r for _, r in zip(range(n), planned, strict=False)]

    drive(requests, engine, feed, 2 * window)
    return engine


def run_admitted(requests: list[Request], tokens: int, window: int) -> tuple[FakeEngine, list[str]]:
    """Dispatch through the admission, told of each answer."""
    engine = FakeEngine(tokens, window)
    admission = Admission(iter(order_window(requests)))
    cache = KvCache(tokens, BLOCK)
    pending: list[str] = []

    def feed(n: int) -> list[Request]:
        admission.finished(Outcome(c, True, 200) for c in pending)
        pending.clear()
        return admission.take(0, n, cache, window) if n > 0 else []

    real_step = engine.step

    def step() -> list[str]:
        out = real_step()
        pending.extend(out)
        return out

    engine.step = step  # type: ignore[method-assign]
    done = drive(requests, engine, feed, 2 * window)
    assert admission.exhausted
    return engine, done


def test_prefix_tree_finds_documents_under_a_shared_system_prompt() -> None:
    system = "You answer questions about documents. " * 20  # ~780 characters, shared by all
    requests = documents(5, 4, system=system)
    tree = prefix_tree(requests)
    assert len(tree.groups) == 5 and not tree.alone
    for group in tree.groups:
        assert len(group.requests) == 4
        leaf, root = group.leaf.chain()
        assert root.parent is None and leaf.parent is root
        assert root.chars >= len(system) and leaf.tokens > 400  # the document's ~2,400 chars
    # One system prompt node, shared.
    assert len({id(g.leaf.parent) for g in tree.groups}) == 1


def test_prefix_tree_keeps_prompts_that_share_nothing_apart() -> None:
    requests = documents(2, 3, alone=4)
    tree = prefix_tree(requests)
    assert sorted(len(g.requests) for g in tree.groups) == [3, 3]
    assert sorted(r.custom_id for r in tree.alone) == [f"alone-{i}" for i in range(4)]


def test_no_prefix_is_computed_twice_by_the_plan_alone_nor_under_admission() -> None:
    # 12 documents of ~600 tokens, 8 questions each; a cache of 1,600 tokens holds two of them
    # (and their questions' own blocks) at most. The plan sends each group whole, so the next
    # document's first request no longer takes the blocks of the questions still waiting (when
    # it went one group early, the plan alone computed 240 document blocks again here).
    requests = documents(12, 8)
    plain = run_plain(requests, tokens=1600, window=64)
    admitted, done = run_admitted(requests, tokens=1600, window=64)
    assert plain.recomputed == 0
    assert admitted.recomputed == 0
    assert sorted(done) == sorted(r.custom_id for r in requests)  # every one, once


def test_nested_prefixes_keep_the_shared_system_prompt_resident() -> None:
    system = "You answer questions about documents. " * 40  # ~390 tokens, shared by every line
    requests = documents(10, 6, system=system)
    admitted, done = run_admitted(requests, tokens=3200, window=64)
    assert admitted.recomputed == 0
    assert sorted(done) == sorted(r.custom_id for r in requests)


def test_prompts_that_share_nothing_fill_the_batch_while_groups_wait() -> None:
    requests = documents(6, 4, alone=40)
    engine, done = run_admitted(requests, tokens=1800, window=32)
    assert engine.recomputed == 0
    # Independent prompts ran beside the groups, not all after them.
    first_half = done[: len(done) // 2]
    assert any(c.startswith("alone-") for c in first_half)
    assert engine.peak_running > 8


def test_without_a_kv_size_the_plan_order_is_kept() -> None:
    requests = documents(4, 3, alone=5)
    admission = Admission(iter(order_window(requests)))
    taken = admission.take(0, 10_000, None, 256)
    assert sorted(r.custom_id for r in taken) == sorted(r.custom_id for r in requests)
    assert admission.exhausted


def test_one_group_larger_than_the_cache_still_runs() -> None:
    requests = documents(2, 5)
    admission = Admission(iter(order_window(requests)))
    first = admission.take(0, 100, KvCache(64, BLOCK), 8)
    assert len(first) == 5 and len({r.custom_id.split("-")[0] for r in first}) == 1
    assert admission.take(0, 100, KvCache(64, BLOCK), 8) == []  # the other waits for room
    admission.finished(Outcome(r.custom_id, True, 200) for r in first)
    second = admission.take(0, 100, KvCache(64, BLOCK), 8)
    assert len(second) == 5 and admission.exhausted


def test_a_retired_workers_groups_go_to_another() -> None:
    requests = documents(2, 6)
    admission = Admission(iter(order_window(requests)))
    cache = KvCache(100_000, BLOCK)
    got = admission.take(0, 3, cache, 8)
    admission.retire(0)
    rest = admission.take(1, 100, cache, 8)
    assert sorted(r.custom_id for r in got + rest) == sorted(r.custom_id for r in requests)


# -- through the scheduler ------------------------------------------------------------------------


class KvWorker(Worker):
    """A worker in process whose engine reports a KV cache of `tokens` and answers one request a
    message, oldest first; it notes the documents it holds each time it is sent more."""

    tokens: ClassVar[int] = 0
    held_docs: ClassVar[list[int]] = []

    def start(self, inbox: Inbox) -> None:
        begin(self, inbox)
        inbox.put(
            (self.index, self.generation, Ready(pid=1, start_s=0.0, kv_cache=(self.tokens, 16)))
        )

    def send(self, requests: Sequence[Request]) -> None:
        self.inflight.update((r.custom_id, r) for r in requests)
        KvWorker.held_docs.append(len({cid.split("-")[0] for cid in self.inflight}))
        for r in requests:
            self._inbox.put((self.index, self.generation, answered([r], {"ok": 1})))

    def stop(self, timeout: float = 10.0, *, leave: bool = False) -> None:
        self.process = None


@pytest.fixture
def rule_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The admission rule switched on as a user does (off by default: run/admission.py)."""
    monkeypatch.setenv(admission_module.ENV, "1")


def run_kv_workers(tmp_path: Path, requests: list[Request]) -> Scheduler:
    """Run `requests` planned (--order auto) through the scheduler and one KvWorker."""
    settings = EngineSettings(engine="vllm", max_num_seqs=64, window=64)
    with JournalWriter(tmp_path / "journal.jsonl") as journal:
        duplicates = Duplicates()  # --order auto
        sink = JournalSink(journal, JobState(), duplicates)
        scheduler = Scheduler(settings, [{}], sink, Events(), KvWorker)
        scheduler.run(plan(iter(requests), "auto", duplicates))
        scheduler.close()
    ids = [r["custom_id"] for r in read_records(tmp_path / "journal.jsonl")]
    assert sorted(ids) == sorted(r.custom_id for r in requests)  # each answered once
    return scheduler


def test_by_default_a_worker_gets_the_plan_as_before(tmp_path: Path) -> None:
    KvWorker.tokens, KvWorker.held_docs = 1600, []
    scheduler = run_kv_workers(tmp_path, documents(10, 6))
    assert scheduler.admission is None
    assert max(KvWorker.held_docs) == 10  # the whole plan at once: vLLM packs it itself


@pytest.mark.usefixtures("rule_on")
def test_the_scheduler_holds_no_more_documents_than_the_cache_holds(tmp_path: Path) -> None:
    requests = documents(10, 6)  # ~600-token documents
    KvWorker.tokens, KvWorker.held_docs = 1600, []
    scheduler = run_kv_workers(tmp_path, requests)
    assert scheduler.admission is not None
    assert max(KvWorker.held_docs) <= 2  # two documents' prefixes and questions fit, not three
    assert scheduler.worker_info["0"]["kv_cache_tokens"] == 1600


@pytest.mark.usefixtures("rule_on")
def test_the_echo_engine_gets_the_plan_order_with_no_limit_said_once(tmp_path: Path) -> None:
    requests = documents(6, 5, alone=7)
    record = tmp_path / "received.txt"
    settings = EngineSettings(engine="echo", max_num_seqs=256, window=256)
    events = Events()
    duplicates = Duplicates()
    with JournalWriter(tmp_path / "journal.jsonl") as journal:
        scheduler = Scheduler(
            settings,
            [{"BATCHRUN_ECHO_RECORD": str(record)}],
            JournalSink(journal, JobState(), duplicates),
            events,
        )
        try:
            scheduler.run(plan(iter(requests), "auto", duplicates))
            scheduler.run(plan(iter(requests[:3]), "auto", duplicates))  # a retry pass, say
        finally:
            scheduler.close()
    assert scheduler.workers[0].kv_cache is None and scheduler.admission is None
    planned = [r.custom_id for r in order_window(requests)]
    received = record.read_text().split()
    assert received[: len(planned)] == planned
    said = [line for line in events.lines if "no KV cache size" in line]
    assert said == [
        "worker 0: the echo engine reports no KV cache size; requests go out in the plan's "
        "order with no prefix budget"
    ]


def test_the_engines_prompt_counts_correct_the_estimates_from_characters() -> None:
    # A tokenizer that makes a token of every 1.33 characters (three times the estimate's 4):
    # once the answers say so, at most half as many documents are open at once.
    def opened(scale_answers: bool) -> int:
        requests = documents(24, 4)
        admission = Admission(iter(order_window(requests)))
        cache = KvCache(4000, BLOCK)
        if scale_answers:
            first = admission.take(0, 8, cache, 64)  # two documents' questions
            admission.finished(
                Outcome(r.custom_id, True, 200, prompt_tokens=3 * estimate(r)) for r in first
            )
            assert admission.scale == 3.0
        taken = admission.take(0, 1000, cache, 64)
        return len({r.custom_id.split("-")[0] for r in taken})

    before, after = opened(False), opened(True)
    assert before >= 4 and after <= before // 2, (before, after)


def estimate(request: Request) -> int:
    """The admission's estimate of a request's prompt tokens, from its characters."""
    return -(-len(f"{request.body.get('model')}\x1d{prompt_text(request)}") // CHARS_PER_TOKEN)


@pytest.mark.parametrize("setting", ["1", None])
def test_batchrun_kv_admission_switches_the_rule_on_through_the_cli(
    tmp_path: Path, setting: str | None
) -> None:
    """A user's BATCHRUN_KV_ADMISSION=1 reaches the scheduler of `batchrun submit`: with the echo
    engine, which reports no KV cache size, the job says once that it keeps no prefix budget and
    answers every line; without it, nothing is said."""
    lines = [chat_line(f"r{i}", f"document {i % 3} question {i}") for i in range(12)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    env = {admission_module.ENV: setting} if setting is not None else {}
    r = submit_echo(src, tmp_path / "job", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    said = [x for x in r.stderr.splitlines() if "reports no KV cache size" in x]
    assert len(said) == (1 if setting else 0), r.stderr[-2000:]
    ids = sorted(x["custom_id"] for x in journal_records(tmp_path / "job"))
    assert ids == sorted(f"r{i}" for i in range(12))
