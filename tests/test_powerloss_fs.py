"""The power-loss file system keeps what a disk keeps after a power cut, and nothing more: the
model every power-loss test of the product stands on (tests/support/powerloss/fs.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from support.powerloss.mount import FuseUnavailable, PowerMount, ensure_fuse, mounted, run_and_cut

pytestmark = [pytest.mark.slow, pytest.mark.powerloss]


@pytest.fixture
def fs(tmp_path: Path) -> tuple[Path, Path]:
    """A backing directory and a mount point; FUSE must work here (it fails, never skips)."""
    try:
        ensure_fuse()
    except FuseUnavailable as e:
        pytest.fail(f"the power-loss tests need FUSE: {e}")
    return tmp_path / "disk", tmp_path / "mnt"


def write(path: Path, data: bytes, *, sync: bool, mode: str = "wb") -> None:
    """Write `data` (appending with mode "ab"), fsync'd or not."""
    with path.open(mode) as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """fsync a directory: what makes the names in it durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_unsynced_data_is_lost_and_synced_data_kept(fs: tuple[Path, Path]) -> None:
    disk, mnt = fs
    with mounted(disk, mnt) as m:
        write(mnt / "a", b"synced\n", sync=True)
        write(mnt / "a", b"not synced\n", sync=False, mode="ab")
        write(mnt / "never", b"never synced\n", sync=False)
        fsync_dir(mnt)
        # Readers see everything before the cut.
        assert (mnt / "a").read_bytes() == b"synced\nnot synced\n"
        m.cut()
    assert (disk / "a").read_bytes() == b"synced\n"
    # Its name durable (the directory was fsync'd), its data never: an empty file.
    assert (disk / "never").read_bytes() == b""


def test_a_rename_is_lost_until_its_directory_is_fsynced(fs: tuple[Path, Path]) -> None:
    disk, mnt = fs
    with mounted(disk, mnt) as m:
        write(mnt / "state", b"old", sync=True)
        fsync_dir(mnt)
        write(mnt / "state.tmp", b"new", sync=True)
        os.replace(mnt / "state.tmp", mnt / "state")
        write(mnt / "created", b"data", sync=True)
        m.cut()
    assert sorted(p.name for p in disk.iterdir()) == ["state"]
    assert (disk / "state").read_bytes() == b"old"


def test_an_fsynced_directory_keeps_its_new_names(fs: tuple[Path, Path]) -> None:
    disk, mnt = fs
    with mounted(disk, mnt) as m:
        write(mnt / "state", b"old", sync=True)
        write(mnt / "gone", b"x", sync=True)
        fsync_dir(mnt)
        write(mnt / "state.tmp", b"new", sync=True)
        os.replace(mnt / "state.tmp", mnt / "state")
        (mnt / "gone").unlink()
        fsync_dir(mnt)
        m.cut()
    assert sorted(p.name for p in disk.iterdir()) == ["state"]
    assert (disk / "state").read_bytes() == b"new"


def test_a_new_directory_needs_its_parent_fsynced(fs: tuple[Path, Path]) -> None:
    disk, mnt = fs
    with mounted(disk, mnt) as m:
        (mnt / "kept").mkdir()
        write(mnt / "kept" / "f", b"data", sync=True)
        fsync_dir(mnt / "kept")
        fsync_dir(mnt)
        # Made after the root's last fsync: its own fsync'd contents go with it.
        (mnt / "lost").mkdir()
        write(mnt / "lost" / "f", b"data", sync=True)
        fsync_dir(mnt / "lost")
        (mnt / "kept" / "g").write_bytes(b"name never made durable")
        (mnt / "unlinked-only-in-memory").write_bytes(b"")
        m.cut()
    assert sorted(p.name for p in disk.iterdir()) == ["kept"]
    assert sorted(p.name for p in (disk / "kept").iterdir()) == ["f"]
    assert (disk / "kept" / "f").read_bytes() == b"data"


def test_an_unlink_is_lost_until_its_directory_is_fsynced(fs: tuple[Path, Path]) -> None:
    disk, mnt = fs
    with mounted(disk, mnt) as m:
        write(mnt / "f", b"data", sync=True)
        fsync_dir(mnt)
        (mnt / "f").unlink()
        m.cut()
    assert (disk / "f").read_bytes() == b"data"


def test_a_clean_unmount_keeps_everything_and_a_remount_reads_it(fs: tuple[Path, Path]) -> None:
    disk, mnt = fs
    with mounted(disk, mnt):
        (mnt / "d").mkdir()
        write(mnt / "d" / "f", b"never synced", sync=False)
    assert (disk / "d" / "f").read_bytes() == b"never synced"
    with mounted(disk, mnt) as m:
        assert (mnt / "d" / "f").read_bytes() == b"never synced"
        write(mnt / "d" / "f", b" more", sync=False, mode="ab")
        m.cut()
    # What the disk held at mount time is durable; the unsynced append is not.
    assert (disk / "d" / "f").read_bytes() == b"never synced"


def test_a_torn_write_keeps_a_prefix_of_the_unsynced_bytes(fs: tuple[Path, Path]) -> None:
    disk, mnt = fs
    kept = set()
    for seed in range(6):
        shutil_rm(disk)
        with mounted(disk, mnt, tear=seed) as m:
            write(mnt / "j", b"line 1\n", sync=True)
            fsync_dir(mnt)
            write(mnt / "j", b"line 2\nline 3\n", sync=False, mode="ab")
            m.cut()
        data = (disk / "j").read_bytes()
        assert b"line 1\nline 2\nline 3\n".startswith(data) and data.startswith(b"line 1\n")
        kept.add(len(data))
    assert len(kept) > 2, f"six seeds tore at only {sorted(kept)}"


def test_a_leak_writes_names_early_with_their_data_unsynced(fs: tuple[Path, Path]) -> None:
    """--leak: a name can reach the disk before its directory's fsync, its bytes not."""
    disk, mnt = fs
    seen = set()
    for seed in range(8):
        shutil_rm(disk)
        with mounted(disk, mnt, leak=seed) as m:
            write(mnt / "state.tmp", b"never synced", sync=False)
            os.replace(mnt / "state.tmp", mnt / "state")
            m.cut()
        names = sorted(p.name for p in disk.iterdir())
        assert names in ([], ["state"])
        if names:
            assert (disk / "state").read_bytes() == b""
        seen.add(tuple(names))
    assert len(seen) == 2, f"eight seeds always left {seen}"


def shutil_rm(path: Path) -> None:
    """Empty a directory tree (the backing directory between two mounts)."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)


WRITER = """
import os, sys
d = sys.argv[1]
fd = os.open(d, os.O_RDONLY)
with open(os.path.join(d, "log"), "ab", buffering=0) as f:
    os.fsync(fd)
    for i in range(1000):
        f.write(b"%04d\\n" % i)
        if i % 10 == 9:
            os.fsync(f.fileno())
"""


def test_a_cut_at_an_operation_kills_the_writer_and_keeps_its_last_fsync(
    fs: tuple[Path, Path],
) -> None:
    disk, mnt = fs
    mount = PowerMount(disk, mnt, cut_at=400)
    cut = run_and_cut(mount, [sys.executable, "-c", WRITER, str(mnt)])
    print(f"cut at {cut.cut}")
    assert cut.exit_code is None, "the writer was not killed by the cut"
    assert cut.cut.startswith("400 ")
    lines = (disk / "log").read_bytes().decode().splitlines()
    # Steps: create, fsyncdir, then per 10 lines 10 writes and an fsync: the cut before step
    # 400 keeps the lines of the last fsync before it.
    assert len(lines) % 10 == 0 and 300 <= len(lines) < 400
    assert lines == [f"{i:04d}" for i in range(len(lines))]
