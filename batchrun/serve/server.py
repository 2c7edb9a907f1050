"""`batchrun serve`: check everything, take the root, build the app, run uvicorn."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shlex
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from batchrun import stopping
from batchrun.errors import BatchrunError
from batchrun.job.files import make_dirs
from batchrun.models.named import model_names
from batchrun.run.jobs import preflight
from batchrun.run.model_routes import prepare_models
from batchrun.run.options import RunOptions
from batchrun.serve.keys import Keys
from batchrun.serve.settings import LOOPBACK, Given, Settings, reread_keys, resolve
from batchrun.serve.settings import save as save_settings

ROOT_LOCK = "server.lock"


def say(line: str) -> None:
    """A line of the server's log, on stderr."""
    sys.stderr.write(f"[batchrun serve] {line}\n")
    sys.stderr.flush()


@contextlib.contextmanager
def root_lock(root: Path) -> Iterator[None]:
    """Hold ROOT/server.lock: two servers on one root would run the same batches twice.

    A refusal to start (the lock held, a port in use) takes away what this call made: the
    root and the directories above it that did not exist, when they are still empty.
    """
    made = _missing_dirs(root)
    try:
        make_dirs(root)
        fd = _locked(root / ROOT_LOCK)
    except OSError as e:
        _unmake(made)
        raise BatchrunError(f"cannot use {root} as the server's root: {e.strerror or e}") from None
    except BatchrunError:
        _unmake(made)
        raise
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    except BatchrunError:
        if made:  # refused before serving: nothing of this root's is worth keeping
            with contextlib.suppress(OSError):
                (root / ROOT_LOCK).unlink()
            _unmake(made)
        raise
    finally:
        os.close(fd)


def _locked(path: Path) -> int:
    """An open descriptor of `path`, locked, or a BatchrunError when another server holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # A server that gave up takes its lock file away: a lock on that file, opened just
            # before, locks nothing another server would see. Lock the file at `path`.
            held, named = os.fstat(fd), os.stat(path)
            if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino):
                return fd
        except FileNotFoundError:
            pass
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise BatchrunError(
                    f"another batchrun serve already runs on {path.parent}; stop it first, or "
                    "choose another --root"
                ) from None
            raise
        os.close(fd)


def _missing_dirs(path: Path) -> list[Path]:
    """The directories from `path` upwards that do not exist yet (deepest first)."""
    missing: list[Path] = []
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            break
        missing.append(p)
    return missing


def _unmake(made: list[Path]) -> None:
    """Remove directories this server made, deepest first, while they are empty."""
    for d in made:
        try:
            d.rmdir()
        except OSError:
            return


def serve(root: Path, given: Given) -> None:
    """Serve the Files and Batches API until stopped, with the root's settings and the options
    `given` over them (serve/settings.py); every batch lives in `root`."""
    import uvicorn

    from batchrun.serve.app import Services, create_app
    from batchrun.serve.batches import BatchStore
    from batchrun.serve.files import FileStore
    from batchrun.serve.kinds import kind_switch_after
    from batchrun.serve.metrics import Metrics
    from batchrun.serve.runner import Runner

    if root.exists() and not root.is_dir():
        raise BatchrunError(f"--root {root} is a file, not a directory")
    settings = resolve(root, given)  # a change that would answer a batch with two models: refused
    options, host, port = settings.options, settings.host, settings.port
    options.check()
    if not settings.keys and settings.keys_file is None and host not in LOOPBACK:
        raise BatchrunError(
            f"--host {host} is not a loopback address: give --api-key KEY (or --api-keys-file "
            "FILE), so that only your clients reach the server",
            exit_code=2,
        )
    kind_switch_after()  # a bad BATCHRUN_SERVE_KIND_SWITCH_S is refused before the root is made
    for line in preflight(options):  # before the root is made: a refusal leaves nothing behind
        say(line)
    # Each model found and each adapter checked (several models: run/model_routes.py); a missing
    # or bad one: one line, nothing served.
    prepare_models(options.settings, say)
    # After Ctrl-C or SIGTERM: the root remembers how it was started (serve/settings.py), so
    # this alone brings the same service back, and the batches go on.
    stopping.set_resume(f"batchrun serve --root {shlex.quote(str(root))}")
    with root_lock(root):
        # Bound before anything else, before the banner and before any batch resumes: a port
        # in use is one line and nothing runs (uvicorn would log it as an error and exit 3).
        sock = listen(host, port)
        save_settings(root, settings.saved)  # once it serves with them
        for change in settings.changes:
            say(f"{change}: applied from now on")
        keys = Keys(settings.keys, required=bool(settings.keys) or settings.keys_file is not None)
        files, batches, metrics = FileStore(root), BatchStore(root), Metrics()
        runner = Runner(root, options, files, batches, metrics, say, settings.gpu_hour_cost)
        metrics.gauges = runner.gauges
        services = Services(
            files,
            batches,
            runner,
            metrics,
            options.settings.model_name,
            keys,
            settings.max_file_bytes,
            say,
        )
        app = create_app(services)
        say(
            f"serving the OpenAI Files and Batches API on http://{host}:{port}/v1; "
            f"root {root}, {_models(options)} on {options.settings.engine}; {_access(keys)}"
        )
        if settings.keys_file is not None:
            _reread_on_sighup(root, settings, keys)
        config = uvicorn.Config(app, log_level="warning", access_log=False)
        uvicorn.Server(config).run(sockets=[sock])


def _reread_on_sighup(root: Path, settings: Settings, keys: Keys) -> None:
    """On SIGHUP, read the keys file again and take its keys from then on (in a thread: the
    signal comes to the main thread, which runs the server's event loop)."""
    assert settings.keys_file is not None
    keys_file, lock = settings.keys_file, threading.Lock()

    def reread() -> None:
        with lock:
            try:
                entries = reread_keys(root, settings.saved, keys_file)
            except BatchrunError as e:
                say(f"SIGHUP: {e}; the keys stay as they were")
                return
            keys.replace(entries)
            say(f"SIGHUP: read {keys_file} again; {_access(keys)}")

    def on_sighup(signum: int, frame: object) -> None:
        threading.Thread(target=reread, name="batchrun-keys", daemon=True).start()

    signal.signal(signal.SIGHUP, on_sighup)


def _access(keys: Keys) -> str:
    """The banner's words for who may use the server."""
    tenants = [e.tenant for e in keys.entries]
    if keys.open():
        return "no API key: open to anyone who can reach this loopback address"
    if not tenants:
        return "no API key in the keys file: nobody gets in until it holds one"
    many = "s" if len(tenants) > 1 else ""
    return f"API keys of {len(tenants)} tenant{many} ({', '.join(tenants)})"


def _models(options: RunOptions) -> str:
    """The banner's words for the model(s) served."""
    names = model_names(options.settings)
    return f"model{'s' if len(names) > 1 else ''} {', '.join(names)}"


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on `host:port`, or a BatchrunError that says why not."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (OSError, UnicodeError) as e:
        raise BatchrunError(f"--host {host}: not an address this machine has ({e})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        hint = "; choose another --port" if e.errno == errno.EADDRINUSE else ""
        raise BatchrunError(f"cannot listen on {host}:{port}: {e.strerror or e}{hint}") from None
    sock.set_inheritable(True)
    return sock
