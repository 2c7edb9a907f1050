"""The power-loss file system from a test's side: mount it, run a command on it, cut the power.

`PowerMount` starts `tests/support/powerloss/fs.py` over a backing directory; `run_and_cut` runs a
command whose files live on the mount and cuts the power at the Nth mutating operation (or just
after the command exits), killing the command's whole process tree the same instant. Once
`unmount` returns, the backing directory holds what a disk would have kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

FS_SCRIPT = Path(__file__).with_name("fs.py")


class FuseUnavailable(RuntimeError):
    """FUSE cannot be mounted here; the message says why."""


def ensure_fuse() -> None:
    """Make FUSE usable (Debian's fuse3 installed where missing, as root) or say why not."""
    if not Path("/dev/fuse").exists():
        raise FuseUnavailable("/dev/fuse does not exist: this machine (or container) has no FUSE")
    if shutil.which("fusermount3") is None:
        _install_fuse3()
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as e:  # OSError: libfuse itself missing
        raise FuseUnavailable(
            f"mfusepy cannot load: {e}; install the dev dependencies (pip install -e '.[dev]') "
            "and Debian's libfuse3-3"
        ) from e


def require_fuse() -> None:
    """FUSE must work on this machine: the test fails saying why (ensure_fuse), never skips."""
    try:
        ensure_fuse()
    except FuseUnavailable as e:
        pytest.fail(f"the power-loss tests need FUSE: {e}")


def _install_fuse3() -> None:
    """apt-get install fuse3 libfuse3-3, once for every test process of the machine."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise FuseUnavailable(
            "fusermount3 is not installed and this user cannot install it: "
            "apt-get install fuse3 libfuse3-3 (as root)"
        )
    lock = Path("/tmp/batchrun-powerloss-apt.lock")
    with lock.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if shutil.which("fusermount3") is not None:
            return
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        steps = [
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "fuse3", "libfuse3-3"],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, env=env, timeout=600)
            if done.returncode != 0:
                raise FuseUnavailable(
                    f"fusermount3 is missing and `{' '.join(step)}` failed: {done.stderr[-500:]}"
                )


@dataclass
class Cut:
    """How one run on the mount ended."""

    exit_code: int | None  # the command's own exit, or None when the cut killed it
    cut: str  # the operation the cut landed on ("N OP PATH"), or "N (told)" after the exit
    stdout: str
    stderr: str


class PowerMount:
    """A mounted power-loss file system over `backing`, at `mountpoint`."""

    def __init__(
        self,
        backing: Path,
        mountpoint: Path,
        *,
        cut_at: int | None = None,
        tear: int | None = None,
        trace: Path | None = None,
        ignore_fsync: str | None = None,
        leak: int | None = None,
    ) -> None:
        self.backing, self.mountpoint = backing, mountpoint
        self.lines: queue.Queue[str] = queue.Queue()
        self.log = mountpoint.parent / f".{mountpoint.name}.fs.log"
        self.cut_line: str | None = None
        self.done_line = ""
        args = [sys.executable, str(FS_SCRIPT), str(backing), str(mountpoint)]
        if cut_at is not None:
            args += ["--cut-at", str(cut_at)]
        if tear is not None:
            args += ["--tear", str(tear)]
        if trace is not None:
            args += ["--trace", str(trace)]
        if leak is not None:
            args += ["--leak", str(leak)]
        if ignore_fsync is not None:
            args += ["--ignore-fsync", ignore_fsync]
        ensure_fuse()
        backing.mkdir(parents=True, exist_ok=True)
        mountpoint.mkdir(parents=True, exist_ok=True)
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        threading.Thread(target=self._read, daemon=True).start()
        line = self._next(30)
        if line != "ready":
            self._abort()
            raise FuseUnavailable(
                f"the power-loss file system did not mount at {mountpoint} ({line or 'no answer'}"
                f"): {self.log.read_text()[-2000:]}"
            )

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("")

    def _next(self, timeout: float) -> str:
        """The file system's next line ("" when it ended or said nothing in time)."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return ""
        if line.startswith("cut "):
            self.cut_line = line[4:]
        return line

    def _send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def poll_cut(self) -> str | None:
        """What the cut landed on, once it has happened."""
        while self.cut_line is None:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return None
            if line.startswith("cut "):
                self.cut_line = line[4:]
        return self.cut_line

    def cut(self) -> str:
        """Cut the power now (when the cut has not already happened)."""
        if self.poll_cut() is None:
            self._send("cut")
            deadline = time.monotonic() + 30
            while self.cut_line is None and time.monotonic() < deadline:
                self._next(1)
        assert self.cut_line is not None, "the file system never confirmed the cut"
        return self.cut_line

    def release(self) -> None:
        """After the cut and the kill: blocked operations fail (EIO), so that the killed
        processes can die (one whose request the file system holds waits for its answer,
        SIGKILL or not)."""
        with contextlib.suppress(BrokenPipeError, ValueError):
            self._send("release")

    def unmount(self) -> str:
        """Let blocked operations fail, unmount, and wait until the backing directory is
        written; return the file system's last line."""
        self.release()
        subprocess.run(
            ["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True, timeout=30
        )
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._abort()
            raise AssertionError(
                f"the file system did not exit: {self.log.read_text()[-2000:]}"
            ) from None
        while True:
            line = self._next(1)
            if not line:
                break
            if line.startswith("unmounted"):
                self.done_line = line
        assert self.proc.returncode == 0 and self.done_line, (
            f"the power-loss file system failed (exit {self.proc.returncode}): "
            f"{self.log.read_text()[-3000:]}"
        )
        return self.done_line

    def _abort(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)
        self.proc.wait()


@contextlib.contextmanager
def mounted(backing: Path, mountpoint: Path, **options: object) -> Iterator[PowerMount]:
    """A PowerMount that is unmounted (cut or clean) however the block ends."""
    mount = PowerMount(backing, mountpoint, **options)  # type: ignore[arg-type]
    try:
        yield mount
    finally:
        if mount.proc.poll() is None:
            mount.unmount()


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything it started (workers lead sessions of their own)."""
    with contextlib.suppress(psutil.Error):
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def run_and_cut(
    mount: PowerMount,
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
    until: Callable[[], bool] | None = None,
) -> Cut:
    """Run `argv` (a process group of its own) until the mount's cut, killing its tree the same
    instant, or until it exits (or `until` holds: a server), then cut; either way the file
    system is unmounted after."""
    logs = mount.mountpoint.parent
    out, err = logs / ".powerloss.stdout", logs / ".powerloss.stderr"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            argv, stdout=o, stderr=e, env=env, cwd=cwd or logs, start_new_session=True, text=True
        )
    deadline = time.monotonic() + timeout
    exit_code: int | None = None
    try:
        while True:
            if mount.poll_cut() is not None:
                kill_tree(proc.pid)
                mount.release()
                proc.wait()
                # Exited by itself before the kill: what it said it did holds (the cut fell
                # after its last operation on the disk).
                exit_code = proc.returncode if proc.returncode >= 0 else None
                break
            code = proc.poll()
            if code is None and until is not None and until():
                mount.cut()
                kill_tree(proc.pid)
                mount.release()
                proc.wait()
                break
            if code is not None:
                exit_code = code
                mount.cut()
                kill_tree(proc.pid)
                mount.release()
                break
            if time.monotonic() > deadline:
                kill_tree(proc.pid)
                mount.cut()
                mount.release()
                proc.wait()
                raise AssertionError(f"{argv[-4:]} ran past {timeout} s: {err.read_text()[-2000:]}")
            time.sleep(0.005)
    finally:
        if mount.proc.poll() is None:
            mount.cut()
            mount.unmount()
    stdout, stderr = out.read_text(), err.read_text()
    out.unlink()
    err.unlink()
    assert mount.cut_line is not None
    return Cut(exit_code, mount.cut_line, stdout, stderr)
