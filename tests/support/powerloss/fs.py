"""A FUSE file system that a power cut empties of exactly what a disk would lose.

Every file's bytes live in memory twice: as written (what readers see) and as of its last
fsync/fdatasync (what the disk holds). Every directory's names live twice too: as they are, and
as of the directory's last fsync. A create, rename, unlink, mkdir or rmdir is held until its
directory is fsync'd (strict POSIX: a file's own fsync makes its bytes durable, not its name).

On a cut (at the Nth mutating operation, `--cut-at N`, or when told on stdin) it stops serving:
every later operation blocks until the controller has killed the processes that use it, then
fails with EIO, so nothing those processes do after the cut reaches the "disk". The durable
state (optionally with the last unsynced appended bytes torn at a random length, `--tear SEED`)
is then written to the backing directory, which afterwards holds exactly what a disk would have
kept. `--leak SEED` also commits a random half of the directories' names without their files'
data, as a file system that writes metadata early may. Unmounted without a cut, the backing directory gets everything, as after a clean shutdown.

Run by `tests/support/powerloss/mount.py`:
    python tests/support/powerloss/fs.py BACKING MOUNTPOINT [--cut-at N] [--tear SEED] [--leak SEED]
        [--trace FILE] [--ignore-fsync REGEX]
stdin takes `cut`, `release`; stdout says `ready`, `cut N OP PATH`, `released`.
"""

from __future__ import annotations

import argparse
import errno
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mfusepy as fuse

# What changes the disk; each counts as one step for `--cut-at` (reads never do).
MUTATING = frozenset(
    {"create", "write", "truncate", "fsync", "fsyncdir", "mkdir", "rmdir", "unlink", "rename"}
    | {"link", "symlink"}
)


@dataclass(eq=False)
class Node:
    """One inode: a file's bytes (live and as last synced), a directory's names (likewise)."""

    kind: int  # stat.S_IFREG, S_IFDIR or S_IFLNK
    mode: int
    data: bytearray = field(default_factory=bytearray)
    synced: bytes = b""
    entries: dict[str, Node] = field(default_factory=dict)
    durable: dict[str, Node] = field(default_factory=dict)
    target: str = ""
    nlink: int = 1
    # When this file was last written and not yet synced (0: nothing unsynced).
    dirty_seq: int = 0
    times: tuple[int, int, int] = field(default_factory=lambda: (time.time_ns(),) * 3)

    def touch(self) -> None:
        """Set mtime and ctime to now."""
        now = time.time_ns()
        self.times = (self.times[0], now, now)


def load(backing: Path) -> Node:
    """The tree under `backing`, as both live and durable state (what the disk holds)."""
    root = Node(stat.S_IFDIR, 0o755)
    _load_dir(backing, root)
    return root


def _load_dir(path: Path, node: Node) -> None:
    with os.scandir(path) as it:
        for entry in it:
            st = entry.stat(follow_symlinks=False)
            child: Node
            if entry.is_symlink():
                child = Node(stat.S_IFLNK, 0o777, target=os.readlink(entry.path))
            elif entry.is_dir(follow_symlinks=False):
                child = Node(stat.S_IFDIR, stat.S_IMODE(st.st_mode))
                _load_dir(Path(entry.path), child)
            else:
                content = Path(entry.path).read_bytes()
                child = Node(stat.S_IFREG, stat.S_IMODE(st.st_mode), bytearray(content), content)
            node.entries[entry.name] = child
    node.durable = dict(node.entries)


def materialize(root: Node, backing: Path, *, durable: bool) -> None:
    """Replace what `backing` holds with the tree: its durable state (after a power cut) or its
    live one (after a clean unmount)."""
    for entry in list(backing.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    _write_dir(root, backing, durable, {id(root)})


def _write_dir(node: Node, path: Path, durable: bool, ancestors: set[int]) -> None:
    for name, child in (node.durable if durable else node.entries).items():
        target = path / name
        if child.kind == stat.S_IFDIR:
            # A directory durably named in two places (a rename fsync'd on one side only) is
            # written under both; one that would contain itself is cut there.
            if id(child) in ancestors:
                continue
            target.mkdir()
            _write_dir(child, target, durable, ancestors | {id(child)})
            target.chmod(child.mode)
        elif child.kind == stat.S_IFLNK:
            os.symlink(child.target, target)
        else:
            target.write_bytes(child.synced if durable else bytes(child.data))
            target.chmod(child.mode)


class PowerCut(Exception):
    """Raised inside an operation that came after the cut (it fails with EIO)."""


class PowerFS(fuse.Operations):
    """The operations: a tree in memory whose durable part survives a cut."""

    use_ns = True

    def __init__(
        self,
        root: Node,
        cut_at: int | None,
        tear: int | None,
        out: Any,
        ignore_fsync: re.Pattern[str] | None = None,
        mountpoint: str = "",
        leak: int | None = None,
    ) -> None:
        self.root = root
        self.leak = leak
        self.mountpoint = mountpoint
        # A planted bug: fsyncs of matching paths do nothing, as if the product never made them
        # (the harness must then report what they protected as lost).
        self.ignore_fsync = ignore_fsync
        self.cut_at = cut_at
        self.tear = tear
        self.out = out
        self.mutex = threading.Condition()
        self.steps = 0
        self.seq = 0
        self.trace: list[str] = []
        self.cut: str | None = None  # what the cut landed on, once it happened
        self.released = False
        self.torn: str = ""
        self.handles: dict[int, tuple[Node, int]] = {}
        self.next_fh = 1

    # --- the cut --------------------------------------------------------------------------

    def say(self, line: str) -> None:
        """One line to the controller."""
        self.out.write(line + "\n")
        self.out.flush()

    def step(self, op: str, path: str | None) -> None:
        """Count a mutating operation; cut before the one `--cut-at` names. Lock held."""
        self.wait_if_cut()
        self.steps += 1
        self.trace.append(f"{self.steps} {op} {path}")
        if self.cut_at is not None and self.steps >= self.cut_at:
            self.power_cut(f"{self.steps} {op} {path}")
            self.wait_if_cut()

    def wait_if_cut(self) -> None:
        """After the cut the machine is dead: block until released, then fail. Lock held."""
        if self.cut is None:
            return
        while not self.released:
            self.mutex.wait()
        raise fuse.FuseOSError(errno.EIO)

    def power_cut(self, what: str) -> None:
        """Stop the disk here: tear the last unsynced append, and let names reach the disk
        before their directory's fsync, when asked. Lock held."""
        if self.cut is not None:
            return
        self.cut = what
        if self.tear is not None:
            self.torn = self._tear(random.Random(self.tear))
        if self.leak is not None:
            self.torn += self._leak(random.Random(self.leak))
        self.say(f"cut {what}{self.torn}")

    def _leak(self, rng: random.Random) -> str:
        """Commit some directories' names without their files' data, as a file system that
        writes metadata early does (ext4 with data=writeback, XFS): a renamed or created file
        whose bytes were never synced is then on the disk empty, or as synced long before."""
        leaked = 0
        stack, seen = [self.root], set()
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.durable != node.entries and rng.random() < 0.5:
                node.durable = dict(node.entries)
                leaked += 1
            stack.extend(c for c in node.durable.values() if c.kind == stat.S_IFDIR)
        return f" ({leaked} directories' names written early)"

    def _tear(self, rng: random.Random) -> str:
        """Let part of the most recent unsynced append reach the disk, as a torn write does."""
        dirty = [n for n in self._durable_files() if n.dirty_seq]
        if not dirty:
            return ""
        node = max(dirty, key=lambda n: n.dirty_seq)
        synced = node.synced
        if len(node.data) <= len(synced) or bytes(node.data[: len(synced)]) != synced:
            return ""  # not a pure append: a disk keeps the old bytes or the new, per block
        keep = rng.randint(len(synced), len(node.data))
        node.synced = synced + bytes(node.data[len(synced) : keep])
        return (
            f" (torn: {keep - len(synced)} of {len(node.data) - len(synced)} unsynced bytes kept)"
        )

    def _durable_files(self) -> list[Node]:
        """The files the durable tree names."""
        found, stack, seen = [], [self.root], set()
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            for child in node.durable.values():
                if child.kind == stat.S_IFDIR:
                    stack.append(child)
                elif child.kind == stat.S_IFREG:
                    found.append(child)
        return found

    def release_all(self) -> None:
        """The processes are dead: blocked operations now fail."""
        with self.mutex:
            self.released = True
            self.mutex.notify_all()

    def control(self, stream: Any) -> None:
        """Read the controller's commands (a thread of its own)."""
        for line in stream:
            command = line.split()
            if not command:
                continue
            if command[0] == "cut":
                with self.mutex:
                    self.power_cut(f"{self.steps} (told)")
            elif command[0] == "release":
                self.release_all()
                self.say("released")
        # The controller is gone (a test killed mid-way): unmount rather than leave a mount
        # whose operations block for ever.
        self.release_all()
        subprocess.run(["fusermount3", "-u", "-z", self.mountpoint], capture_output=True)

    # --- lookups ----------------------------------------------------------------------------

    def _node(self, path: str | None, fh: int | None = None) -> Node:
        if fh is not None and fh in self.handles:
            return self.handles[fh][0]
        if path is None:
            raise fuse.FuseOSError(errno.EBADF)
        node = self.root
        for part in path.strip("/").split("/"):
            if not part:
                continue
            if node.kind != stat.S_IFDIR:
                raise fuse.FuseOSError(errno.ENOTDIR)
            child = node.entries.get(part)
            if child is None:
                raise fuse.FuseOSError(errno.ENOENT)
            node = child
        return node

    def _parent(self, path: str) -> tuple[Node, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._node(head or "/")
        if parent.kind != stat.S_IFDIR:
            raise fuse.FuseOSError(errno.ENOTDIR)
        return parent, name

    def _handle(self, node: Node, flags: int) -> int:
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = (node, flags)
        return fh

    # --- reads (never a step) ---------------------------------------------------------------

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        with self.mutex:
            self.wait_if_cut()
            node = self._node(path, fh)
            if node.kind == stat.S_IFDIR:
                size = 4096
                nlink = 2 + sum(1 for c in node.entries.values() if c.kind == stat.S_IFDIR)
            else:
                size = len(node.target.encode()) if node.kind == stat.S_IFLNK else len(node.data)
                nlink = node.nlink
            atime, mtime, ctime = node.times
            return {
                "st_mode": node.kind | node.mode,
                "st_nlink": nlink,
                "st_size": size,
                "st_blocks": (size + 511) // 512,
                "st_uid": os.getuid(),
                "st_gid": os.getgid(),
                "st_atime": atime,
                "st_mtime": mtime,
                "st_ctime": ctime,
            }

    def readdir(self, path: str, fh: int) -> list[str]:
        with self.mutex:
            self.wait_if_cut()
            return [".", "..", *self._node(path, fh).entries]

    def readlink(self, path: str) -> str:
        with self.mutex:
            self.wait_if_cut()
            return self._node(path).target

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        with self.mutex:
            self.wait_if_cut()
            return bytes(self._node(path, fh).data[offset : offset + size])

    def statfs(self, path: str) -> dict[str, int]:
        blocks = 1 << 24
        return {
            "f_bsize": 4096,
            "f_frsize": 4096,
            "f_blocks": blocks,
            "f_bfree": blocks,
            "f_bavail": blocks,
            "f_files": 1 << 20,
            "f_ffree": 1 << 20,
            "f_favail": 1 << 20,
            "f_namemax": 255,
        }

    def open(self, path: str, flags: int) -> int:
        with self.mutex:
            self.wait_if_cut()
            node = self._node(path)
            if flags & os.O_TRUNC and node.kind == stat.S_IFREG:
                self.step("truncate", path)
                self._resize(node, 0)
            return self._handle(node, flags)

    def opendir(self, path: str) -> int:
        with self.mutex:
            self.wait_if_cut()
            return self._handle(self._node(path), 0)

    def release(self, path: str | None, fh: int) -> int:
        with self.mutex:
            self.handles.pop(fh, None)
        return 0

    def releasedir(self, path: str | None, fh: int) -> int:
        return self.release(path, fh)

    def flush(self, path: str | None, fh: int) -> int:
        return 0

    def access(self, path: str, amode: int) -> int:
        with self.mutex:
            self.wait_if_cut()
            self._node(path)
        return 0

    # --- metadata that needs no fsync here (nothing checks it after a cut) -----------------

    def chmod(self, path: str | None, mode: int) -> int:
        with self.mutex:
            self.wait_if_cut()
            node = self._node(path)
            node.mode = stat.S_IMODE(mode)
            node.touch()
        return 0

    def chown(self, path: str | None, uid: int, gid: int) -> int:
        return 0

    def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> int:
        with self.mutex:
            self.wait_if_cut()
            node = self._node(path)
            now = time.time_ns()
            atime, mtime = times if times is not None else (now, now)
            node.times = (atime, mtime, now)
        return 0

    # --- data: live now, durable at fsync ---------------------------------------------------

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        with self.mutex:
            self.step("create", path)
            parent, name = self._parent(path)
            node = parent.entries.get(name)
            if node is None:
                node = Node(stat.S_IFREG, stat.S_IMODE(mode))
                parent.entries[name] = node
                parent.touch()
            elif flags & os.O_EXCL:
                raise fuse.FuseOSError(errno.EEXIST)
            return self._handle(node, flags)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        with self.mutex:
            self.step("write", path)
            node, flags = self.handles.get(fh) or (self._node(path), 0)
            if flags & os.O_APPEND:
                offset = len(node.data)
            if offset > len(node.data):
                node.data.extend(bytes(offset - len(node.data)))
            node.data[offset : offset + len(data)] = data
            self._dirty(node)
            return len(data)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        with self.mutex:
            self.step("truncate", path)
            self._resize(self._node(path, fh), length)
        return 0

    def _resize(self, node: Node, length: int) -> None:
        if length < len(node.data):
            del node.data[length:]
        else:
            node.data.extend(bytes(length - len(node.data)))
        self._dirty(node)

    def _dirty(self, node: Node) -> None:
        self.seq += 1
        node.dirty_seq = self.seq
        node.touch()

    def _ignored(self, path: str | None) -> bool:
        return self.ignore_fsync is not None and self.ignore_fsync.search(path or "") is not None

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        with self.mutex:
            self.step("fsync", path)
            node = self._node(path, fh)
            if self._ignored(path):
                return 0
            node.synced = bytes(node.data)
            node.dirty_seq = 0
        return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        with self.mutex:
            self.step("fsyncdir", path)
            node = self._node(path, fh)
            if self._ignored(path):
                return 0
            node.durable = dict(node.entries)
        return 0

    # --- names: live now, durable when their directory is fsync'd ---------------------------

    def mkdir(self, path: str, mode: int) -> int:
        with self.mutex:
            self.step("mkdir", path)
            parent, name = self._parent(path)
            if name in parent.entries:
                raise fuse.FuseOSError(errno.EEXIST)
            parent.entries[name] = Node(stat.S_IFDIR, stat.S_IMODE(mode))
            parent.touch()
        return 0

    def rmdir(self, path: str) -> int:
        with self.mutex:
            self.step("rmdir", path)
            parent, name = self._parent(path)
            node = self._node(path)
            if node.kind != stat.S_IFDIR:
                raise fuse.FuseOSError(errno.ENOTDIR)
            if node.entries:
                raise fuse.FuseOSError(errno.ENOTEMPTY)
            del parent.entries[name]
            parent.touch()
        return 0

    def unlink(self, path: str) -> int:
        with self.mutex:
            self.step("unlink", path)
            parent, name = self._parent(path)
            node = self._node(path)
            if node.kind == stat.S_IFDIR:
                raise fuse.FuseOSError(errno.EISDIR)
            del parent.entries[name]
            node.nlink -= 1
            parent.touch()
        return 0

    def rename(self, old: str, new: str) -> int:
        with self.mutex:
            self.step("rename", f"{old} -> {new}")
            old_parent, old_name = self._parent(old)
            node = self._node(old)
            new_parent, new_name = self._parent(new)
            replaced = new_parent.entries.get(new_name)
            if replaced is node:
                return 0
            if replaced is not None:
                if replaced.kind == stat.S_IFDIR:
                    if node.kind != stat.S_IFDIR:
                        raise fuse.FuseOSError(errno.EISDIR)
                    if replaced.entries:
                        raise fuse.FuseOSError(errno.ENOTEMPTY)
                elif node.kind == stat.S_IFDIR:
                    raise fuse.FuseOSError(errno.ENOTDIR)
                replaced.nlink -= 1
            del old_parent.entries[old_name]
            new_parent.entries[new_name] = node
            old_parent.touch()
            new_parent.touch()
        return 0

    def link(self, target: str, source: str) -> int:
        with self.mutex:
            self.step("link", f"{source} -> {target}")
            node = self._node(source)
            parent, name = self._parent(target)
            if name in parent.entries:
                raise fuse.FuseOSError(errno.EEXIST)
            parent.entries[name] = node
            node.nlink += 1
        return 0

    def symlink(self, target: str, source: str) -> int:
        with self.mutex:
            self.step("symlink", target)
            parent, name = self._parent(target)
            if name in parent.entries:
                raise fuse.FuseOSError(errno.EEXIST)
            parent.entries[name] = Node(stat.S_IFLNK, 0o777, target=source)
        return 0


def main(argv: list[str] | None = None) -> int:
    """Mount, serve until unmounted, then leave the backing directory as a disk would."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backing", type=Path)
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--cut-at", type=int, help="cut before the Nth mutating operation")
    parser.add_argument("--tear", type=int, help="tear the last unsynced append (this seed)")
    parser.add_argument("--trace", type=Path, help="write the mutating operations here")
    parser.add_argument(
        "--leak", type=int, help="names reach the disk before their directory's fsync (seed)"
    )
    parser.add_argument(
        "--ignore-fsync", help="plant a bug: fsyncs of paths matching it do nothing"
    )
    args = parser.parse_args(argv)
    ignore = re.compile(args.ignore_fsync) if args.ignore_fsync else None
    fs = PowerFS(
        load(args.backing),
        args.cut_at,
        args.tear,
        sys.stdout,
        ignore,
        str(args.mountpoint),
        args.leak,
    )
    threading.Thread(target=fs.control, args=(sys.stdin,), daemon=True).start()

    def ready(_path: str) -> None:
        fs.say("ready")

    fs.init = ready  # type: ignore[method-assign]
    # One thread: operations run one at a time, in the order the kernel sends them. hard_remove:
    # an unlinked file still open is gone at once (libfuse would otherwise rename it to a
    # .fuse_hidden name, a namespace change no program made).
    fuse.FUSE(
        fs,
        str(args.mountpoint),
        foreground=True,
        nothreads=True,
        fsname="powerfs",
        hard_remove=True,
    )
    with fs.mutex:
        cut = fs.cut is not None
        materialize(fs.root, args.backing, durable=cut)
    if args.trace is not None:
        args.trace.write_text("".join(line + "\n" for line in fs.trace))
    fs.say(f"unmounted after {fs.steps} steps ({'cut' if cut else 'clean'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
