"""Power cuts through an embeddings job, whose bodies and vectors its workers write to their
shards (job/shards.py; a duplicate's copy, to the journal's side file, job/vectors.py): after
every cut at a seeded moment, on a file system that keeps only what a disk keeps
(tests/support/powerloss/), every journaled record's body and vectors are there and exact, the
job resumes, and every request comes out once with its own vector."""

from __future__ import annotations

import base64
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli
from support.jobs import submit_echo
from support.lines import write_jsonl
from support.powerloss.crashes import BATCHRUN, CrashPoint, Violation
from support.powerloss.mount import Cut, require_fuse
from support.vectors import embedding_lines

from batchrun.engines.echo import echo_vector_bytes
from batchrun.errors import BatchrunError
from batchrun.job.shards import ShardReader, restore, shards_dir
from batchrun.job.vectors import VectorReader

pytestmark = [pytest.mark.slow, pytest.mark.powerloss]

SEED = int(os.environ.get("BATCHRUN_POWERLOSS_SEED") or random.randrange(1_000_000))
REQUESTS = 160
ECHO = ["--engine", "echo", "--batch-size", "16"]
DIMENSIONS = 256


@pytest.fixture(autouse=True)
def fuse_here() -> None:
    """FUSE must work on this machine: the tests fail saying why, never skip."""
    require_fuse()


def vectors_answered(job: Path, where: str) -> set[str]:
    """The requests the journal answers, each checked: its vectors in the side file, exact,
    and no request answered twice."""
    path = job / "journal.jsonl"
    if not path.exists():
        return set()
    data = path.read_bytes()
    done: set[str] = set()
    with VectorReader(path) as reader, ShardReader(shards_dir(job)) as shards:
        for n, raw in enumerate(data[: data.rfind(b"\n") + 1].splitlines(keepends=True), 1):
            try:
                rec = json.loads(restore(raw, reader, shards))
            except (BatchrunError, ValueError) as e:
                raise Violation(f"{where}: journal line {n} cannot be read whole: {e}") from None
            if rec["kind"] != "result" or not rec["ok"]:
                continue
            cid = rec["custom_id"]
            if cid in done:
                raise Violation(f"{where}: {cid} answered twice")
            vector = base64.b64decode(rec["body"]["data"][0]["embedding"])
            if vector != echo_vector_bytes(f"passage {cid[1:]}", DIMENSIONS):
                raise Violation(f"{where}: {cid}'s vector is not its own")
            done.add(cid)
    return done


def test_an_embeddings_job_survives_power_cuts(tmp_path: Path, record_property: Any) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", embedding_lines(REQUESTS, DIMENSIONS))
    every = {f"e{i}" for i in range(REQUESTS)}

    def check(cut: Cut, disk: Path, where: str) -> None:
        job = disk / "job"
        # Before the next open, the journal may name vectors the cut lost (the open cuts
        # those records off); a job that said it finished must have kept them all.
        if cut.exit_code == 0 and vectors_answered(job, where) != every:
            raise Violation(f"{where}: the job said it finished, but not every vector is kept")
        if (job / "manifest.json").exists():
            done = cli("resume", "--job-dir", str(job))
        else:
            done = submit_echo(src, job, progress=True)
        if done.returncode != 0:
            raise Violation(f"{where}: no recovery (exit {done.returncode}): {done.stderr[-800:]}")
        if vectors_answered(job, f"{where}, after recovery") != every:
            raise Violation(f"{where}: after recovery, not every request is answered")
        exported = cli("export", "--job-dir", str(job))
        outputs = [json.loads(x) for x in (job / "output.jsonl").read_text().splitlines()]
        if exported.returncode != 0 or {o["custom_id"] for o in outputs} != every:
            raise Violation(f"{where}: the export is not whole")

    point = CrashPoint(
        "submit (embeddings)",
        tmp_path / "submit",
        lambda mnt: [*BATCHRUN, "submit", str(src), "--job-dir", str(mnt / "job"), *ECHO],
        check,
        cuts=4,
        seed=SEED,
        env={**os.environ, "BATCHRUN_ECHO_DELAY_MS": "3"},
    )
    total = point.run()
    record_property("powerloss", f"embeddings submit, {total} cuts, seed {SEED}")
