"""A reference run of raw vLLM beside a test's job (the image, audio and LoRA jobs)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from support.paths import ROOT


@contextlib.contextmanager
def reference_run(command: list[str], log: Path) -> Iterator[Callable[[], str]]:
    """Run a reference (raw vLLM) in a process of its own beside the test's job, its stderr in
    `log`; yield a function that waits for it and returns its stdout, failing with the end of
    its log if it failed. A test that gives up first kills it."""
    out_path = log.with_suffix(".stdout")
    # The test's import path (pytest's pythonpath): a helper of tests/support run as a script
    # imports the others as `support.<module>`.
    path = [str(ROOT / "tests"), str(ROOT / "scripts"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    with log.open("w") as err, out_path.open("w") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=err, cwd=ROOT, env=env, start_new_session=True
        )

    def finish() -> str:
        proc.wait(timeout=900)
        assert proc.returncode == 0, log.read_text()[-3000:]
        return out_path.read_text()

    try:
        yield finish
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
