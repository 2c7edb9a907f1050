"""Crash harness: kill batchrun at random moments, resume, and prove nothing is lost or answered twice.

    .venv/bin/python scripts/chaos.py                       # echo engine, 3,000 requests, 60 kills
    .venv/bin/python scripts/chaos.py --kills 10 --requests 400 --seed 7
    BATCHRUN_HOME=/tmp/brcache .venv/bin/python scripts/chaos.py --engine vllm  # 200 req, 5 kills
    .venv/bin/python scripts/chaos.py --plant-bug duplicate-result   # the checker must fail
    .venv/bin/python scripts/chaos.py --cache-dir /tmp/answers  # twice: the 2nd job hits the 1st's

What it does, with a seeded random generator (the seed is printed first; `--seed` repeats a run):

1. Writes an input file: `--requests` valid chat requests (each with a unique text, which the echo
   engine answers with; some with n=2), invalid lines of several kinds mixed in (each kind's
   expected error code is known), blank lines and CRLF endings. With the echo engine, `--fail`
   requests always fail (BATCHRUN_ECHO_FAIL), so retry passes and attempt counting run too, and
   `--poison` requests kill the engine worker whenever it receives them (BATCHRUN_ECHO_CRASH_ON),
   so the supervisor must isolate each one (it must end as its own failed line, `engine_crash`,
   after exactly one attempt) while the kills go on around it.
2. Runs `batchrun submit` in a process group of its own and kills the whole group with SIGKILL at a
   random moment; then `batchrun resume` (or `submit` again, if the kill came before the job's
   manifest existed, as a person would), killed again, and so on, `--kills` times. The first kill
   aims at submit's validation (the moment the journal gets its first bytes, before the manifest
   is written); a fifth of the others fall in a run's start-up (before an engine worker is
   ready); the rest a random time after the worker is ready, paced by the results per second seen
   so far so that each run finishes about its share of what is left. With `--graceful`,
   that fraction of the stops are SIGINT (to the group, like Ctrl-C), SIGTERM (to batchrun) or two
   SIGINTs in quick succession instead, which must exit 130/143 with a flushed journal and a hint
   that works.
3. After each stop it checks the journal (every whole line a record, no request answered twice,
   attempts numbered 1, 2, ... with no gap, no invalid line recorded twice, only the input's ids),
   and that no process of the killed group is left running.
4. Runs `resume` to the end without a kill, then `status --json` and `export` (twice), and checks:
   every valid custom_id appears exactly once in output.jsonl (or, for the failing ones, in
   errors.jsonl after exactly --max-attempts attempts), with the right answer, in input order;
   every invalid line appears once in errors.jsonl with its line number and code; the journal
   replays (no corrupt line, no torn tail); status's counts match the files; a second export is
   byte for byte the same.
5. Prints the figures and exits 0 when no invariant was broken, 1 when one was (each violation is
   listed), 2 when the harness could not do what was asked (e.g. the job finished before all the
   kills: give it more --requests or a longer --delay-ms).

`--cache-dir DIR` runs every command with that answer cache (run/answer_cache.py), and the echo
requests at temperature 0 (deterministic, so cached): kills then fall between a result's journal
write and its cache write too. Run it twice with the same DIR: the second job is answered from
what the first stored under kills, and the same checks hold (each custom_id answered once, with
the right answer); status's `cache_hits` is printed.

`--serve N` instead kills `batchrun serve`, N times, between making a batch's output file and
saving its id in the batch's record (and at random moments while it runs): scripts/chaos_serve.py.

`--plant-bug KIND` corrupts the job on purpose, to show that the checker can fail:
duplicate-result (copy a finished answer's journal line), drop-invalid (delete an invalid line's
record: resume never writes it again), wrong-answer (change a finished answer), garbage (a line of
garbage in the middle of the journal), each between two kills (after the last run if no stop left
a line to corrupt), and drop-result (delete a finished answer after the last run: between kills
that would be no bug, resume runs the request again).

The harness only drives the CLI (`python -m batchrun`, with this interpreter) and reads the files;
it imports nothing from batchrun. `--report FILE` writes the figures and violations as JSON.
The invariants of steps 3 and 4 are scripts/chaos_check.py's `Checker` (unit-tested on journals
written by hand in tests/test_chaos_checker.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos_check import Checker, Expected, JournalView, read_journal

CHAT = "/v1/chat/completions"
PLANTS = ("duplicate-result", "drop-invalid", "wrong-answer", "drop-result", "garbage")
WORDS = [
    "amber",
    "basil",
    "cedar",
    "delta",
    "ember",
    "fjord",
    "garnet",
    "harbor",
    "iris",
    "juniper",
    "kelp",
    "lumen",
    "maple",
    "nectar",
    "onyx",
    "pepper",
    "quartz",
    "raven",
    "sorrel",
    "tundra",
    "umber",
    "violet",
    "willow",
    "xenon",
    "yarrow",
    "zephyr",
]

# The invalid lines the generated input carries: kind -> (raw line given a tag, expected code).
# The duplicate's tag is the custom_id of an earlier valid line.
INVALID_KINDS: dict[str, tuple[Any, str]] = {
    "truncated JSON": (
        lambda t: json.dumps(_req(f"cut-{t}", "never finished")).encode()[:50],
        "invalid_json",
    ),
    "not JSON": (lambda t: f"this is not json {t}".encode(), "invalid_json"),
    "non-UTF-8 bytes": (lambda t: b'{"custom_id": "caf\xe9-' + t.encode() + b'"}', "invalid_json"),
    "JSON array": (lambda t: f'["{t}"]'.encode(), "invalid_request"),
    "missing custom_id": (
        lambda t: json.dumps({"method": "POST", "url": CHAT, "body": {}}).encode(),
        "missing_custom_id",
    ),
    "negative max_tokens": (
        lambda t: json.dumps(_req(f"neg-{t}", "x", max_tokens=-1)).encode(),
        "invalid_request",
    ),
    "stream true": (
        lambda t: json.dumps(_req(f"stream-{t}", "x", stream=True)).encode(),
        "invalid_request",
    ),
    "unknown url": (
        lambda t: json.dumps({**_req(f"url-{t}", "x"), "url": "/v2/unknown"}).encode(),
        "invalid_url",
    ),
    "role that does not exist": (
        lambda t: json.dumps(
            {
                "custom_id": f"role-{t}",
                "method": "POST",
                "url": CHAT,
                "body": {"model": "chaos", "messages": [{"role": "wizard", "content": "x"}]},
            }
        ).encode(),
        "invalid_request",
    ),
    "empty messages": (
        lambda t: json.dumps(
            {
                "custom_id": f"empty-{t}",
                "method": "POST",
                "url": CHAT,
                "body": {"model": "chaos", "messages": []},
            }
        ).encode(),
        "invalid_request",
    ),
    "duplicate custom_id": (
        lambda t: json.dumps(_req(t, "a second copy")).encode(),
        "duplicate_custom_id",
    ),
}


def _req(cid: str, text: str, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "method": "POST",
        "url": CHAT,
        "body": {"model": "chaos", "messages": [{"role": "user", "content": text}], **body},
    }


# --- the input ------------------------------------------------------------------------------


def write_input(path: Path, n: int, rng: random.Random, args: argparse.Namespace) -> Expected:
    """The chaos input: n valid requests, one invalid line per ~`--invalid-every` of them (at
    least one of every kind), at random places."""
    exp = Expected(max_tokens=args.max_tokens)
    kinds = list(INVALID_KINDS)
    n_invalid = max(len(kinds), n // args.invalid_every) if args.invalid_every else 0
    # After which requests the invalid lines go (several may follow one request).
    after = Counter(rng.randrange(n) for _ in range(n_invalid))
    lineno = 0
    out = bytearray()

    def emit(raw: bytes) -> int:
        nonlocal lineno
        lineno += 1
        out.extend(raw + (b"\r\n" if rng.random() < 0.05 else b"\n"))
        return lineno

    ids = []
    for i in range(n):
        cid = f"req-{i:06d}"
        if args.engine == "echo":
            # A unique text that the echo engine answers with, shorter than max_tokens words.
            text = f"chaos {i} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))
        else:
            text = f"Say the word {rng.choice(WORDS)}."
        body: dict[str, Any] = {"max_tokens": args.max_tokens}
        if args.engine == "vllm" or args.cache_dir:
            body["temperature"] = 0  # deterministic: vLLM's answers checkable, or cached
        nchoices = 2 if args.engine == "echo" and i % 7 == 3 else 1
        if nchoices > 1:
            body["n"] = nchoices
        line = emit(json.dumps(_req(cid, text, **body)).encode())
        exp.valid[cid] = {"line": line, "answer": text, "n": nchoices}
        ids.append(cid)
        if rng.random() < 0.02:
            emit(b"" if rng.random() < 0.5 else b"  \t")  # blank lines are not errors
        for _ in range(after[i]):
            # Every kind once first, then at random.
            kind = kinds[len(exp.invalid)] if len(exp.invalid) < len(kinds) else rng.choice(kinds)
            make, code = INVALID_KINDS[kind]
            tag = rng.choice(ids) if kind == "duplicate custom_id" else f"{i}-{lineno}"
            line = emit(make(tag))
            exp.invalid[line] = {"kind": kind, "code": code}
    if args.engine == "echo" and args.fail:
        exp.failing = set(rng.sample(ids, min(args.fail, len(ids))))
    if args.engine == "echo" and args.poison:
        rest = [cid for cid in ids if cid not in exp.failing]
        exp.poison = set(rng.sample(rest, min(args.poison, len(rest))))
    path.write_bytes(bytes(out))
    return exp


# --- running batchrun -----------------------------------------------------------------------


def stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command (which may hold spaces and parentheses) ends at the last ')'.
    return stat[stat.rfind(")") + 2 :].split()


def group_alive(pgid: int) -> list[int]:
    """Pids of live (not zombie) processes in process group `pgid`."""
    pids = []
    for entry in os.listdir("/proc"):
        rest = stat_fields(entry) if entry.isdigit() else None
        if rest and len(rest) > 2 and rest[0] != "Z" and int(rest[2]) == pgid:
            pids.append(int(entry))
    return pids


@dataclass
class Cycle:
    """One run of batchrun and how it ended."""

    command: str
    stop: str  # "kill", "int", "term", "int-int" or "none"
    at: float | None
    rc: int | None = None
    phase: str = ""
    seconds: float = 0.0
    first_progress: float | None = None
    ready: float | None = None
    stopped_at: float | None = None
    mode: str = ""
    stderr: str = ""
    ray: bool = False
    actor_kill_at: float | None = None  # seconds after ready


class Harness:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.work = Path(args.work_dir or tempfile.mkdtemp(prefix="batchrun-chaos-")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.job = self.work / "job"
        self.input = self.work / "input.jsonl"
        self.logs = self.work / "logs"
        self.logs.mkdir(exist_ok=True)
        self.record = self.work / "engine-received.txt"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
        if "BATCHRUN_HOME" in os.environ and args.engine == "vllm":
            self.env["BATCHRUN_HOME"] = os.environ["BATCHRUN_HOME"]
        elif args.engine == "echo":
            self.env["BATCHRUN_HOME"] = str(self.work / "cache")
        if args.engine == "echo":
            self.env["BATCHRUN_ECHO_DELAY_MS"] = str(args.delay_ms)
            self.env["BATCHRUN_ECHO_RECORD"] = str(self.record)
        self.cycles: list[Cycle] = []
        self.startups: list[float] = []
        self.busy_s = 0.0
        self.busy_records = 0
        self.planted: str | None = None
        self.runs = 0
        self.last_pgid = 0
        self.import_tracebacks = 0
        self.actor_kills: list[int] = []  # pids of Ray actors SIGKILLed mid-run
        self.actors_noticed = 0  # its death seen by batchrun, a replacement started
        self.actors_replaced = 0  # ... and the replacement ready before the run ended
        self.runs_without_ray = 0

    # -- pacing ----------------------------------------------------------------------------

    def startup(self) -> float:
        """Seconds from a run's start to its first engine worker being ready (median seen)."""
        if self.startups:
            return statistics.median(self.startups)
        return 30.0 if self.args.engine == "vllm" else 1.0

    def pick_moment(self, remaining: int, kills_left: int) -> tuple[float, bool, str]:
        """When to stop the next run: (seconds, counted from the worker being ready?, mode).

        A fifth of the stops fall in start-up (before the engine is ready); the others a random
        time after it is ready, paced by the results per second seen so far so that each run
        finishes about its share of what is left.
        """
        if self.rng.random() < 0.2:
            return self.rng.uniform(0.0, self.startup()), False, "start-up"
        rate = self.busy_records / self.busy_s if self.busy_s > 0.5 and self.busy_records else None
        if rate is None:
            # No pace known yet: a guess (the vLLM engine on a CPU is slow to its first result).
            high = 10.0 if self.args.engine == "vllm" else 1.5
            return self.rng.uniform(0.0, high), True, f"guess: 0-{high:.0f}s after ready"
        target = remaining / (kills_left + 1)
        # On average about `target` results, and (nearly) never the whole job: a run may go
        # twice the pace seen so far (a run on Ray after one without, warm caches), and one
        # that finishes the job before its stop leaves the stops asked for short (exit 2).
        high = max(min(2 * target / rate, 0.5 * remaining / rate), 0.02)
        return self.rng.uniform(0.0, high), True, f"paced: 0-{high:.2f}s after ready"

    # -- one run ---------------------------------------------------------------------------

    def command(self) -> list[str]:
        a = self.args
        if not (self.job / "manifest.json").exists():
            cmd = ["submit", str(self.input), "--job-dir", str(self.job), "--engine", a.engine]
            cmd += ["--max-attempts", str(a.max_attempts), "--no-progress"]
            if a.batch_size:
                cmd += ["--batch-size", str(a.batch_size)]
            if a.workers:
                cmd += ["--workers", str(a.workers)]
            if a.engine == "vllm":
                cmd += ["--max-model-len", str(a.max_model_len)]
                if a.gpu_memory_utilization:
                    cmd += ["--gpu-memory-utilization", str(a.gpu_memory_utilization)]
            if a.cache_dir:
                cmd += ["--cache-dir", a.cache_dir]
            return cmd + (["--ray", "local"] if a.ray else [])
        cmd = ["resume", "--job-dir", str(self.job), "--no-progress"]
        if a.cache_dir:
            cmd += ["--cache-dir", a.cache_dir]
        if a.ray and self.rng.random() < 0.2:
            # A job started on Ray goes on without it (and back): one job directory, either way.
            self.runs_without_ray += 1
            return cmd
        return cmd + (["--ray", "local"] if a.ray else [])

    def run_once(
        self,
        stop: str,
        at: float | None,
        *,
        after_ready: bool = False,
        target_validation: bool = False,
    ) -> Cycle:
        """Start batchrun; stop it with `stop` `at` seconds after its start (or after its first
        engine worker is ready, with `after_ready`), or let it finish (`at` None)."""
        cmd = self.command()
        cycle = Cycle(command=cmd[0], stop=stop, at=at, ray="--ray" in cmd)
        if cycle.ray and (at is None or after_ready):
            # An actor SIGKILLed mid-run: the run must replace it and go on. In the last run
            # always; otherwise in most runs, before the moment the whole run is stopped.
            if at is None:
                cycle.actor_kill_at = self.rng.uniform(0.2, 2.0)
            elif self.rng.random() < 0.7:
                cycle.actor_kill_at = self.rng.uniform(0.0, 0.6 * at)
        self.runs += 1
        log = self.logs / f"run-{self.runs:03d}-{cmd[0]}.log"
        started = time.monotonic()
        with log.open("wb") as logf:
            proc = subprocess.Popen(
                [sys.executable, "-m", "batchrun", *cmd],
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=self.work,
                env=self.env,
                start_new_session=True,
            )
            self.last_pgid = proc.pid
            try:
                self._watch(proc, cycle, log, started, after_ready, target_validation)
            finally:
                if proc.poll() is None and cycle.stopped_at is None:
                    # The harness itself is being stopped (Ctrl-C, a closed pipe): take the
                    # run along rather than leave it behind.
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
            cycle.rc = proc.wait()
        cycle.seconds = time.monotonic() - started
        cycle.stderr = log.read_text(errors="replace")
        self.cycles.append(cycle)
        if cycle.ray:
            self.check_actor_replacement(cycle)
        return cycle

    def check_actor_replacement(self, cycle: Cycle) -> None:
        """Each actor killed in this run was noticed, and (if the run went on) replaced."""
        text = cycle.stderr
        for pid in self.actor_kills:
            ready = re.search(rf"ray worker (\d+)[^\n]* ready \(pid {pid}\b", text)
            if not ready:
                continue
            index = ready.group(1)
            after = text[ready.end() :]
            died = re.search(rf"ray worker {index}\b[^\n]* died\b[^\n]*starting a fresh", after)
            if died:
                self.actors_noticed += 1
            if died and re.search(rf"ray worker {index}\b[^\n]* ready \(pid ", after[died.end() :]):
                self.actors_replaced += 1
            elif cycle.stop == "none":
                self.checker.fail(
                    f"run {self.runs}: Ray actor pid {pid} (worker {index}) was killed and "
                    "not replaced before the job finished"
                )

    def _watch(
        self,
        proc: subprocess.Popen[bytes],
        cycle: Cycle,
        log: Path,
        started: float,
        after_ready: bool,
        target_validation: bool,
    ) -> None:
        """Watch a run until its moment comes (then stop it) or it ends by itself."""
        at = cycle.at
        journal = self.job / "journal.jsonl"
        # Whole lines only: opening the journal cuts a torn tail, then new records follow.
        size0 = whole_size(journal)
        had_manifest = (self.job / "manifest.json").exists()
        # With after_ready, the deadline is set when the worker is ready.
        deadline = started + (self.args.final_timeout if at is None or after_ready else at)
        last_look = 0.0
        while True:
            now = time.monotonic()
            if proc.poll() is not None:
                return
            if cycle.ready is None and now - last_look > 0.02:
                last_look = now
                if b" ready (pid " in log.read_bytes():
                    cycle.ready = now - started
                    if after_ready and at is not None:
                        deadline = now + at
            if (
                cycle.actor_kill_at is not None
                and cycle.ready is not None
                and now - started >= cycle.ready + cycle.actor_kill_at
            ):
                cycle.actor_kill_at = None
                self.kill_an_actor(log)
            size = journal.stat().st_size if journal.exists() else 0
            manifest = (self.job / "manifest.json").exists()
            if not manifest and size > size0:
                # Submit validated and journaled the invalid lines; the manifest is not written
                # yet: the moment the first stop aims at.
                if target_validation and deadline > now:
                    time.sleep(self.rng.uniform(0, 0.0003))
                    deadline = now
            elif manifest and not had_manifest:
                # Submit just created the job: results start from here.
                size0, had_manifest = size, True
            elif cycle.first_progress is None and size > size0:
                cycle.first_progress = now - started
            if target_validation and deadline > now + 0.3 and manifest:
                # Missed that moment (or the input has no invalid line): stop it soon.
                deadline = now + self.rng.uniform(0, 0.3)
            if now >= deadline:
                break
            time.sleep(0.0002 if target_validation else 0.005)
        if at is None:
            self.violation_timeout(proc)
            return
        cycle.phase = self.phase(cycle)
        cycle.stopped_at = time.monotonic() - started
        self.stop(proc, cycle.stop)

    def kill_an_actor(self, log: Path) -> None:
        """SIGKILL one live Ray actor of the current run (found by the pid its "ready" names)."""
        text = log.read_text(errors="replace")
        pids = [int(m) for m in re.findall(r"ray worker \d+[^\n]* ready \(pid (\d+)", text)]
        alive = [pid for pid in pids if pid not in self.actor_kills and _alive(pid)]
        if not alive:
            return
        pid = self.rng.choice(alive)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            self.actor_kills.append(pid)
            if not self.args.quiet:
                print(f"[chaos] SIGKILLed Ray actor pid {pid}", flush=True)

    def phase(self, cycle: Cycle) -> str:
        """Where a run was when it was stopped."""
        if not (self.job / "manifest.json").exists():
            return "in submit, before the job existed"
        if cycle.ready is None:
            return "before an engine worker was ready"
        if cycle.first_progress is None:
            return "worker ready, no result yet"
        return "mid-stream"

    def stop(self, proc: subprocess.Popen[bytes], how: str) -> None:
        if how == "kill":
            os.killpg(proc.pid, signal.SIGKILL)
        elif how == "int":
            os.killpg(proc.pid, signal.SIGINT)
        elif how == "term":
            proc.send_signal(signal.SIGTERM)
        elif how == "int-int":
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(self.rng.uniform(0, 0.05))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
        if how != "kill":
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.checker.fail(f"run {self.runs}: {how} did not stop batchrun within 60 s")
                os.killpg(proc.pid, signal.SIGKILL)

    def violation_timeout(self, proc: subprocess.Popen[bytes]) -> None:
        self.checker.fail(f"run {self.runs}: did not finish within {self.args.final_timeout:.0f} s")
        os.killpg(proc.pid, signal.SIGKILL)

    # -- planting bugs -----------------------------------------------------------------------

    def plant(self, kind: str) -> None:
        path = self.job / "journal.jsonl"
        if not path.exists():
            return
        raw = path.read_bytes()
        lines = raw.split(b"\n")
        tail = lines.pop()
        idx = [
            i
            for i, line in enumerate(lines)
            if (b'"kind":"invalid"' in line) == (kind == "drop-invalid")
            and (kind == "drop-invalid" or b'"ok":true' in line)
        ]
        if kind == "garbage":
            idx = list(range(len(lines)))
        if not idx:
            return
        i = self.rng.choice(idx)
        if kind == "duplicate-result":
            lines.insert(i + 1, lines[i])
        elif kind in ("drop-invalid", "drop-result"):
            del lines[i]
        elif kind == "wrong-answer":
            rec = json.loads(lines[i])
            rec["body"]["choices"][0]["message"]["content"] += " (tampered)"
            lines[i] = json.dumps(rec, ensure_ascii=False, separators=(",", ":")).encode()
        elif kind == "garbage":
            lines.insert(i, b"@@ not a journal record @@")
        path.write_bytes(b"".join(line + b"\n" for line in lines) + tail)
        self.planted = f"{kind} at journal line {i + 1}"
        print(f"[chaos] planted bug: {self.planted}", flush=True)

    # -- the whole run -----------------------------------------------------------------------

    def remaining(self, view: JournalView, exp: Expected) -> int:
        done = {r.get("custom_id") for r in view.records if r.get("kind") == "result"}
        return sum(1 for cid in exp.valid if cid not in done)

    def main(self) -> int:
        a = self.args
        print(f"[chaos] seed {a.seed}", flush=True)
        exp = write_input(self.input, a.requests, self.rng, a)
        if exp.failing:
            self.env["BATCHRUN_ECHO_FAIL"] = ",".join(sorted(exp.failing))
        if exp.poison:
            self.env["BATCHRUN_ECHO_CRASH_ON"] = ",".join(sorted(exp.poison))
        self.checker = Checker(exp, a.engine, a.max_attempts)
        ck = self.checker
        print(
            f"[chaos] {a.engine} engine; {len(exp.valid):,} valid requests, {len(exp.invalid)} "
            f"invalid lines of {exp.kinds()} kinds, {len(exp.failing)} failing on purpose, "
            f"{len(exp.poison)} poison; "
            f"{a.kills} kills; work dir {self.work}",
            flush=True,
        )
        plant_at = None
        if a.plant_bug and a.plant_bug != "drop-result":
            # Planted after that stop, or the first later one with a line to corrupt.
            plant_at = self.rng.randint(1, max(1, a.kills // 2))
        kills = graceful = 0
        shortfall = False
        started = time.monotonic()
        stops = 0
        while stops < a.kills:
            view = read_journal(self.job / "journal.jsonl")
            remaining = self.remaining(view, exp)
            first = stops == 0 and not (self.job / "manifest.json").exists()
            how = "kill"
            if not first and a.graceful and self.rng.random() < a.graceful:
                how = self.rng.choice(["int", "term", "int-int"])
            if first:
                at, after_ready, mode = self.startup() * 4 + 5.0, False, "validation"
            else:
                at, after_ready, mode = self.pick_moment(remaining, a.kills - stops)
            cycle = self.run_once(how, at, after_ready=after_ready, target_validation=first)
            cycle.mode = mode
            where = f"after stop {stops + 1} ({how}, {cycle.command})"
            if cycle.ready is not None:
                self.startups.append(cycle.ready)
            elif cycle.phase and cycle.seconds > self.startup():
                # Stopped before the worker was ready, later than the estimate: start-up takes
                # longer than the estimate says.
                self.startups.append(cycle.seconds * 1.25)
            if cycle.first_progress is not None:
                view_after = read_journal(self.job / "journal.jsonl")
                self.busy_records += max(0, len(view_after.records) - len(view.records))
                end = cycle.stopped_at if cycle.stopped_at is not None else cycle.seconds
                self.busy_s += max(0.0, end - cycle.first_progress)
            if cycle.phase == "":
                # It ended by itself before the moment came.
                if "error:" in cycle.stderr or cycle.rc not in (0, 1):
                    ck.fail(f"run {self.runs} ({cycle.command}) failed: {last_line(cycle.stderr)}")
                    break
                shortfall = True
                break
            if how != "kill" and cycle.rc in (0, 1) and finished(cycle.stderr):
                # The signal came as the run finished the whole job (its summary is printed):
                # too late to stop anything.
                shortfall = True
                break
            stops += 1
            if how == "kill":
                kills += 1
            else:
                graceful += 1
                self.check_graceful(cycle, where)
            deadline = time.monotonic() + 5
            while (alive := group_alive(self.last_pgid)) and time.monotonic() < deadline:
                time.sleep(0.05)
            if alive:
                ck.fail(f"{where}: processes {alive} of the stopped run are still alive")
                for pid in alive:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            view = read_journal(self.job / "journal.jsonl")
            ck.check_journal(view, where, final=False)
            if not a.quiet:
                print(
                    f"[chaos] stop {stops}/{a.kills}: {how} {cycle.command} at {cycle.seconds:.2f}s "
                    f"({cycle.phase}; {mode}); {len(view.records):,} journal records, "
                    f"{self.remaining(view, exp):,} requests left",
                    flush=True,
                )
            if plant_at is not None and stops >= plant_at and self.planted is None:
                self.plant(a.plant_bug)
        # The last run: no kill.
        final = self.run_once("none", None)
        want_rc = 1 if (exp.invalid or exp.failing or exp.poison) else 0
        if final.rc != want_rc and not (a.plant_bug and final.rc == 1):
            ck.fail(
                f"the final {final.command} exited {final.rc}, expected {want_rc}: {last_line(final.stderr)}"
            )
        if a.plant_bug and self.planted is None:
            # drop-result always comes here; the others when no stop left a line to corrupt.
            self.plant(a.plant_bug)
        view = read_journal(self.job / "journal.jsonl")
        journal = ck.check_journal(view, "final journal", final=True)
        status = self.cli_json(["status", "--job-dir", str(self.job), "--json"])
        if self.args.cache_dir and status is not None:
            print(f"answered from the cache: {status.get('cache_hits')}")
        checked = 0
        r1 = self.cli(["export", "--job-dir", str(self.job)])
        if r1.returncode != 0:
            ck.fail(f"export failed: {last_line(r1.stderr)}")
        else:
            first_bytes = (self.job / "output.jsonl").read_bytes() + (
                self.job / "errors.jsonl"
            ).read_bytes()
            checked = ck.check_exports(self.job, journal, status)
            r2 = self.cli(["export", "--job-dir", str(self.job)])
            again = (self.job / "output.jsonl").read_bytes() + (
                self.job / "errors.jsonl"
            ).read_bytes()
            if r2.returncode != 0 or again != first_bytes:
                ck.fail("export: a second export differs from the first")
        received = self.record.read_text().split("\n")[:-1] if self.record.exists() else []
        counts = Counter(received)
        resent = sum(
            max(0, n - (a.max_attempts if cid in exp.failing else 1))
            for cid, n in counts.items()
            if cid not in exp.poison
        )
        figures = {
            "seed": a.seed,
            "engine": a.engine,
            "requests": len(exp.valid),
            "invalid_lines": len(exp.invalid),
            "invalid_kinds": exp.kinds(),
            "failing_on_purpose": len(exp.failing),
            "poison": len(exp.poison),
            "poison_received": sum(counts[cid] for cid in exp.poison),
            "kills_asked": a.kills,
            "kills_survived": kills,
            "graceful_stops": graceful,
            "graceful_kinds": dict(
                Counter(f"{c.stop} -> {c.rc}" for c in self.cycles if c.phase and c.stop != "kill")
            ),
            "interrupted_while_importing": self.import_tracebacks,
            "stop_phases": dict(Counter(c.phase for c in self.cycles if c.phase)),
            "cycles": [
                {
                    "command": c.command,
                    "stop": c.stop,
                    "mode": c.mode,
                    "at": None if c.at is None else round(c.at, 3),
                    "ready": None if c.ready is None else round(c.ready, 3),
                    "first_result": None
                    if c.first_progress is None
                    else round(c.first_progress, 3),
                    "stopped_at": None if c.stopped_at is None else round(c.stopped_at, 3),
                    "seconds": round(c.seconds, 3),
                    "exit": c.rc,
                    "phase": c.phase,
                }
                for c in self.cycles
            ],
            "runs": self.runs,
            "submits": sum(1 for c in self.cycles if c.command == "submit"),
            "journal_records": len(view.records),
            "engine_received": len(received),
            "requests_resent_after_a_stop": resent,
            "rows_checked": checked,
            "planted_bug": self.planted,
            "ray": a.ray,
            "ray_actors_killed": len(self.actor_kills),
            "ray_actors_noticed": self.actors_noticed,
            "ray_actors_replaced": self.actors_replaced,
            "runs_without_ray": self.runs_without_ray,
            "violations": len(ck.violations),
            "seconds": round(time.monotonic() - started, 1),
            "work_dir": str(self.work),
        }
        self.report(figures, shortfall)
        if a.report:
            Path(a.report).write_text(
                json.dumps({**figures, "violation_list": ck.violations}, indent=2) + "\n"
            )
        if ck.violations:
            return 1
        if shortfall:
            return 2
        if not a.keep and not a.work_dir:
            shutil.rmtree(self.work, ignore_errors=True)
        return 0

    def check_graceful(self, cycle: Cycle, where: str) -> None:
        ck = self.checker
        ok_codes = {"int": {130, -2}, "term": {143, -15}, "int-int": {130, -2, 1}}[cycle.stop]
        if cycle.rc not in ok_codes:
            ck.fail(
                f"{where}: exit code {cycle.rc}, expected one of {sorted(ok_codes)}: {last_line(cycle.stderr)}"
            )
        if "Traceback" in cycle.stderr:
            if startup_traceback(cycle.stderr):
                # Python's own KeyboardInterrupt traceback while it imports batchrun's modules,
                # before any of its code ran (the job is untouched): Python's behaviour, tolerated.
                self.import_tracebacks += 1
            else:
                ck.fail(f"{where}: a traceback on stderr: {traceback_summary(cycle.stderr)}")
        journal = self.job / "journal.jsonl"
        if cycle.stop != "int-int" and journal.exists() and cycle.rc in (130, 143):
            raw = journal.read_bytes()
            if raw and not raw.endswith(b"\n"):
                ck.fail(f"{where}: the journal was not flushed (torn last line) after {cycle.stop}")
        if cycle.rc in (130, 143) and "batchrun resume" in cycle.stderr:
            # The hint must work: resume may not refuse the job it was told to continue.
            r = self.cli(["status", "--job-dir", str(self.job), "--json"])
            if r.returncode != 0:
                ck.fail(
                    f"{where}: the hint says `batchrun resume`, but the job cannot be read: "
                    f"{last_line(r.stderr)}"
                )

    def cli(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "batchrun", *args],
            capture_output=True,
            text=True,
            cwd=self.work,
            env=self.env,
            timeout=600,
        )

    def cli_json(self, args: list[str]) -> dict[str, Any] | None:
        r = self.cli(args)
        try:
            data = json.loads(r.stdout)
        except ValueError:
            self.checker.fail(f"{' '.join(args[:1])} --json failed: {last_line(r.stderr)}")
            return None
        return data if isinstance(data, dict) else None

    def report(self, f: dict[str, Any], shortfall: bool) -> None:
        ck = self.checker
        phases = ", ".join(f"{n} {p}" for p, n in sorted(f["stop_phases"].items()))
        print()
        print(f"chaos report (seed {f['seed']}, {f['engine']} engine, {f['seconds']:.0f} s)")
        print(
            f"  requests            {f['requests']:,} valid + {f['invalid_lines']} invalid lines "
            f"({f['invalid_kinds']} kinds), {f['failing_on_purpose']} failing on purpose"
        )
        if f["poison"]:
            print(
                f"  poison requests     {f['poison']} that crash the engine worker: received "
                f"{f['poison_received']} times in all (in flight at kills and crashes), each "
                "ended as its own engine_crash line"
            )
        print(
            f"  kills survived      {f['kills_survived']} SIGKILLs of the whole process group"
            + (f" + {f['graceful_stops']} graceful stops" if f["graceful_stops"] else "")
        )
        print(f"  where they landed   {phases}")
        if f["graceful_kinds"]:
            kinds = ", ".join(f"{n}x {k}" for k, n in sorted(f["graceful_kinds"].items()))
            print(f"  graceful stops      {kinds} (signal -> exit code)")
        if f["interrupted_while_importing"]:
            print(
                f"  tolerated           {f['interrupted_while_importing']} SIGINT(s) while Python "
                "was still importing batchrun (its own KeyboardInterrupt traceback; job untouched)"
            )
        print(f"  runs                {f['runs']} ({f['submits']} submit)")
        if f["ray"]:
            print(
                f"  Ray                 {f['ray_actors_killed']} actors SIGKILLed mid-run: "
                f"{f['ray_actors_noticed']} deaths seen and a replacement started, "
                f"{f['ray_actors_replaced']} replacements ready before their run was stopped; "
                f"{f['runs_without_ray']} runs resumed without Ray"
            )
        if f["engine_received"]:
            print(
                f"  engine received     {f['engine_received']:,} requests: "
                f"{f['requests_resent_after_a_stop']:,} re-sent after a stop or a crash "
                "(in flight), "
                "each answered once"
            )
        print(
            f"  rows checked        {f['rows_checked']:,} (output.jsonl + errors.jsonl), "
            f"{f['journal_records']:,} journal records"
        )
        if f["planted_bug"]:
            print(f"  planted bug         {f['planted_bug']}")
        print(f"  violations          {len(ck.violations)}")
        for v in ck.violations[:40]:
            print(f"    - {v}")
        if len(ck.violations) > 40:
            print(f"    ... and {len(ck.violations) - 40} more")
        if shortfall:
            print(
                f"  NOTE: the job finished after {f['kills_survived'] + f['graceful_stops']} of "
                f"{f['kills_asked']} stops; give it more --requests or a longer --delay-ms"
            )
        if ck.violations or shortfall or self.args.keep or self.args.work_dir:
            print(f"  work dir            {self.work}")


def _alive(pid: int) -> bool:
    rest = stat_fields(pid)
    return rest is not None and bool(rest) and rest[0] != "Z"


def whole_size(path: Path) -> int:
    """The size of the file up to and including its last newline."""
    if not path.exists():
        return 0
    raw = path.read_bytes()
    return raw.rfind(b"\n") + 1


def finished(log: str) -> bool:
    """Whether a run's output ends with the summary of a finished job: the last line of its
    summary, which says what to run next (console/render.next_step)."""
    ends = ("Write the results with", "failed: see", "cannot run as written")
    return any(end in log for end in ends)


def last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:300] if lines else "(no output)"


def startup_traceback(text: str) -> bool:
    """Whether a traceback only shows modules being imported (no batchrun function had run)."""
    frames = [x for x in text.splitlines() if x.strip().startswith('File "')]
    ours = [x for x in frames if "batchrun" in x and "site-packages" not in x]
    return bool(frames) and all(x.rstrip().endswith("in <module>") for x in ours)


def traceback_summary(text: str) -> str:
    lines = [x for x in text.splitlines() if x.strip()]
    errs = [x for x in lines if not x.startswith(" ") and ("Error" in x or "Interrupt" in x)]
    return (errs[-1] if errs else lines[-1])[:200] if lines else ""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Kill batchrun at random moments, resume, and check that no request is lost "
        "or answered twice.",
    )
    p.add_argument("--engine", choices=("echo", "vllm"), default="echo")
    p.add_argument("--kills", type=int, help="stops before the last run [echo 60, vllm 5]")
    p.add_argument("--requests", type=int, help="valid requests [echo 3000, vllm 200]")
    p.add_argument("--seed", type=int, help="random seed [a fresh one, printed]")
    p.add_argument("--delay-ms", type=int, default=50, help="echo: latency per request [50]")
    p.add_argument(
        "--cache-dir", help="run every command with this answer cache (requests at temperature 0)"
    )
    p.add_argument("--batch-size", type=int, help="requests in flight per worker [echo 4, vllm 8]")
    p.add_argument("--workers", type=int, help="engine workers [echo 2, vllm 1]")
    p.add_argument("--max-tokens", type=int, help="max_tokens of every request [16]")
    p.add_argument("--max-model-len", type=int, default=512, help="vllm: context length [512]")
    p.add_argument(
        "--gpu-memory-utilization", type=float, help="vllm: passed to submit [batchrun's default]"
    )
    p.add_argument("--max-attempts", type=int, default=2, help="attempts per request [2]")
    p.add_argument("--fail", type=int, default=5, help="echo: requests that always fail [5]")
    p.add_argument(
        "--poison", type=int, help="echo: requests that crash the engine worker [3; 0 with --ray]"
    )
    p.add_argument(
        "--invalid-every", type=int, default=100, help="about one invalid line per N requests [100]"
    )
    p.add_argument(
        "--graceful",
        type=float,
        default=0.0,
        help="fraction of the stops that are SIGINT / SIGTERM / two SIGINTs instead of SIGKILL [0]",
    )
    p.add_argument(
        "--ray",
        action="store_true",
        help="run on a local Ray instance (--ray local), SIGKILL actors mid-run too [off]",
    )
    p.add_argument("--plant-bug", choices=PLANTS, help="corrupt the job on purpose (see above)")
    p.add_argument(
        "--final-timeout", type=float, help="seconds for the last run [echo 900, vllm 1800]"
    )
    p.add_argument(
        "--work-dir", help="where to work (kept) [a temporary directory, removed on success]"
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--report", help="write the figures and violations to this JSON file")
    p.add_argument("-q", "--quiet", action="store_true", help="no line per stop")
    p.add_argument(
        "--serve",
        type=int,
        default=0,
        help="instead: N cycles of `batchrun serve` SIGKILLed between making a batch's output "
        "file and saving its id (and at random moments), checked after each restart "
        "(scripts/chaos_serve.py) [0]",
    )
    p.add_argument(
        "--serve-requests", type=int, default=200, help="--serve: requests per batch [200]"
    )
    args = p.parse_args(argv)
    vllm = args.engine == "vllm"
    defaults = {
        "kills": 5 if vllm else 60,
        "requests": 200 if vllm else 3000,
        "batch_size": 8 if vllm else 4,
        "workers": 1 if vllm else 2,
        "max_tokens": 16,
        "final_timeout": 1800.0 if vllm else 900.0,
        # Not with Ray: an actor killed on purpose while a lone suspect runs would blame it.
        "poison": 0 if vllm or args.ray else 3,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "big")
    if vllm:
        args.fail = 0
    if args.kills < 1 or args.requests < 1:
        p.error("--kills and --requests must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        import chaos_serve

        work = Path(args.work_dir or tempfile.mkdtemp(prefix="batchrun-chaos-")).resolve()
        work.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
        env["BATCHRUN_HOME"] = str(work / "cache")
        return chaos_serve.run(args, work, env)
    return Harness(args).main()


if __name__ == "__main__":
    sys.exit(main())
