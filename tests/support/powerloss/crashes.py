"""Crash points: a command run on the power-loss file system, cut at seeded moments, then
checked and recovered on what the disk kept.

A crash point runs its command once to the end (tracing every mutating operation, then cutting
the power just after the exit: what an exit code promised must hold), then once per cut from the
same starting state, each cut before a seeded operation of that trace (stratified: cut i of n
falls in the i-th n-th of the trace, so validation, the run and the summary's saves all get cut).
After each cut `check` judges the disk as it was left, then recovers the job on it (resume,
export again) and checks the end state.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.powerloss.mount import Cut, PowerMount, run_and_cut

BATCHRUN = [sys.executable, "-m", "batchrun"]


@dataclass
class Spec:
    """An input of echo requests: every valid request's expected answer, the invalid lines."""

    input: Path
    answers: dict[str, str]
    invalid: list[int]

    @property
    def finished_code(self) -> int:
        """The exit code of a run that finished every request (invalid lines make it 1)."""
        return 1 if self.invalid else 0


def make_input(path: Path, n: int, *, invalid: int = 3) -> Spec:
    """`n` deterministic echo chat requests (temperature 0: the answer cache takes them) with
    `invalid` bad lines among them."""
    answers: dict[str, str] = {}
    bad: list[int] = []
    lines = []
    every = max(1, n // (invalid + 1)) if invalid else 0
    for i in range(n):
        if invalid and len(bad) < invalid and i and i % every == 0:
            lines.append('{"custom_id": "broken", "method": "POST"')
            bad.append(len(lines))
        cid = f"req-{i:05d}"
        text = f"power {i} word"
        answers[cid] = text
        body = {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0}
        lines.append(
            json.dumps(
                {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}
            )
        )
    path.write_text("".join(line + "\n" for line in lines))
    return Spec(path, answers, bad)


class Violation(AssertionError):
    """A promise broken after a power cut."""


def journal_records(job: Path, where: str) -> list[dict[str, Any]]:
    """The journal's whole lines; a line that is not a record is a violation (a torn last line
    is not: the next open cuts it)."""
    path = job / "journal.jsonl"
    if not path.exists():
        return []
    data = path.read_bytes()
    records = []
    for n, raw in enumerate(data[: data.rfind(b"\n") + 1].splitlines(), start=1):
        try:
            rec = json.loads(raw)
        except ValueError:
            rec = None
        if not isinstance(rec, dict) or "kind" not in rec:
            raise Violation(f"{where}: journal line {n} is not a record: {raw[:120]!r}")
        if "shard" in rec:  # its body is in its worker's shard (job/shards.py), read as it is
            name, at, length = rec["shard"][:3]
            shard = job / "shards" / f"{name}.res"
            data = shard.read_bytes()[at : at + length] if shard.exists() else b""
            if len(data) != length:
                raise Violation(f"{where}: journal line {n} names bytes {shard.name} lacks")
            rec["body"] = json.loads(data)
        records.append(rec)
    return records


def answered(job: Path, spec: Spec, where: str) -> tuple[Counter[str], Counter[int]]:
    """Each request's successes and each invalid line's records in the journal, checked: no id
    outside the input, every answer right, no request answered twice."""
    ok: Counter[str] = Counter()
    invalid: Counter[int] = Counter()
    for rec in journal_records(job, where):
        if rec["kind"] == "invalid":
            invalid[rec["line"]] += 1
            continue
        cid = rec.get("custom_id")
        if cid not in spec.answers:
            raise Violation(f"{where}: the journal answers {cid!r}, not a request of the input")
        if ok[cid]:
            raise Violation(f"{where}: {cid} answered twice (a result after its success)")
        if rec.get("ok"):
            content = rec["body"]["choices"][0]["message"]["content"]
            if content != spec.answers[cid]:
                raise Violation(f"{where}: {cid} answered {content!r}, not {spec.answers[cid]!r}")
            ok[cid] += 1
    return ok, invalid


def check_all_answered(job: Path, spec: Spec, where: str) -> None:
    """Every request answered exactly once and every invalid line recorded exactly once."""
    if not (job / "manifest.json").exists():
        raise Violation(f"{where}: {job}/manifest.json is gone")
    ok, invalid = answered(job, spec, where)
    missing = [cid for cid in spec.answers if ok[cid] != 1]
    if missing:
        raise Violation(
            f"{where}: {len(missing)} of {len(spec.answers)} requests have no result "
            f"(first {missing[:3]})"
        )
    if sorted(invalid) != spec.invalid or any(v != 1 for v in invalid.values()):
        raise Violation(f"{where}: invalid lines recorded {dict(invalid)}, expected {spec.invalid}")


def check_export(out_dir: Path, spec: Spec, where: str, *, parquet: bool = False) -> None:
    """The export is whole: each request once, with its answer, each invalid line once."""
    if parquet:
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(out_dir / "results.parquet")
        except Exception as e:  # a torn parquet file: its footer is missing
            raise Violation(f"{where}: results.parquet cannot be read: {e}") from None
        ids = [cid for cid in table.column("custom_id").to_pylist() if cid in spec.answers]
        if ids != list(spec.answers) or table.num_rows != len(spec.answers) + len(spec.invalid):
            raise Violation(f"{where}: results.parquet has {table.num_rows} rows, not whole")
        return
    out, err = out_dir / "output.jsonl", out_dir / "errors.jsonl"
    try:
        lines = [json.loads(x) for x in out.read_text().splitlines()]
        errors = [json.loads(x) for x in err.read_text().splitlines()]
    except (OSError, ValueError) as e:
        raise Violation(f"{where}: the export cannot be read whole: {e}") from None
    got = {x["custom_id"]: x["response"]["body"]["choices"][0]["message"]["content"] for x in lines}
    if len(lines) != len(spec.answers) or got != spec.answers:
        raise Violation(f"{where}: output.jsonl has {len(lines)} lines, {len(spec.answers)} due")
    if sorted(e["error"]["line"] for e in errors) != spec.invalid:
        raise Violation(f"{where}: errors.jsonl lines {len(errors)}, expected {spec.invalid}")


def is_finished(cut: Cut, spec: Spec) -> bool:
    """Whether the command said it finished the job (exit 0, or 1 for the invalid lines with
    the job completed) before the power went."""
    if cut.exit_code == 0:
        return True
    return cut.exit_code == spec.finished_code and "completed" in cut.stdout


def recover(
    job: Path, spec: Spec, where: str, cli: Callable[..., Any], *, command: str = "resume"
) -> None:
    """What a user does after the power is back: `command` the job again (resume, or submit
    it again when it never got a manifest), then export; every request must come out once."""
    if (job / "manifest.json").exists():
        done = cli(command, "--job-dir", str(job))
    else:
        done = cli("submit", str(spec.input), "--job-dir", str(job), "--engine", "echo")
    text = done.stdout + done.stderr
    if done.returncode != spec.finished_code or "Traceback" in text or "corrupt" in text:
        raise Violation(
            f"{where}: the job does not recover (exit {done.returncode}): {text[-1500:]}"
        )
    check_all_answered(job, spec, f"{where}, after recovery")
    exported = cli("export", "--job-dir", str(job))
    if exported.returncode != 0:
        raise Violation(f"{where}: export after recovery failed: {exported.stderr[-800:]}")
    check_export(job, spec, f"{where}, after recovery")


@dataclass
class CrashPoint:
    """One command cut at seeded moments, from one starting state (a template directory)."""

    name: str
    root: Path
    argv: Callable[[Path], list[str]]  # given the mount point
    check: Callable[[Cut, Path, str], None]  # given the cut, the disk and where
    template: Path | None = None
    cuts: int = 4
    seed: int = 0
    tear: bool = True
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    # A planted bug (fs.py --ignore-fsync): fsyncs of matching paths do nothing.
    ignore_fsync: str | None = None
    done: int = 0
    trace: list[str] = field(default_factory=list)  # the run to the end's operations
    # A server never exits: the run ends (and the power is cut) once this holds.
    until: Callable[[], bool] | None = None

    def _fresh(self) -> Path:
        disk = self.root / "disk"
        shutil.rmtree(disk, ignore_errors=True)
        if self.template is not None:
            shutil.copytree(self.template, disk, symlinks=True)
        else:
            disk.mkdir(parents=True)
        return disk

    def _run(self, **options: Any) -> tuple[Cut, Path]:
        disk = self._fresh()
        mount = PowerMount(disk, self.root / "mnt", ignore_fsync=self.ignore_fsync, **options)
        argv = self.argv(self.root / "mnt")
        return run_and_cut(mount, argv, env=self.env, until=self.until), disk

    def state_at(self, at: int, tear: int | None = None) -> Path:
        """The disk as a cut before operation `at` leaves it (a start for another point)."""
        return self._run(cut_at=at, tear=tear)[1]

    def run(self) -> int:
        """Run the command to its end and cut after, then cut it `cuts` times; return the
        number of cuts. Each is printed with the seed, so a failure can be run again."""
        self.root.mkdir(parents=True, exist_ok=True)
        trace = self.root / "trace"
        cut, disk = self._run(trace=trace)
        self.trace = trace.read_text().splitlines()
        steps = len(self.trace)
        where = f"{self.name} (seed {self.seed}), cut after the exit {cut.exit_code}"
        print(f"[powerloss] {self.name}: seed {self.seed}, {steps} mutating operations a run")
        print(f"[powerloss]   {where}: cut at {cut.cut}")
        self.check(cut, disk, where)
        self.done = 1
        rng = random.Random(self.seed)
        for i in range(self.cuts):
            lo = 1 + i * steps // self.cuts
            at = rng.randint(lo, max(lo, (i + 1) * steps // self.cuts))
            tear = rng.randrange(1 << 30) if self.tear else None
            # Every other cut also lets names reach the disk early (fs.py --leak): the strict
            # model alone never shows a file renamed into place with its bytes unsynced.
            leak = rng.randrange(1 << 30) if i % 2 else None
            cut, disk = self._run(cut_at=at, tear=tear, leak=leak)
            where = f"{self.name} (seed {self.seed}), cut {i + 1} of {self.cuts}"
            print(f"[powerloss]   {where}: at {cut.cut} of {steps}, exit {cut.exit_code}")
            self.check(cut, disk, where)
            self.done += 1
        return self.done


def template_of(disk: Path, into: Path) -> Path:
    """Keep what a disk holds as the starting state of another crash point."""
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(disk, into, symlinks=True)
    return into
