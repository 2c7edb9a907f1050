"""Engine workers as Ray actors: the same scheduler, journal and guarantees, spread over a cluster.

Ray places each actor where its resources are (one GPU, or a tensor-parallel group of them, per
actor; CPU only when the cluster has no GPUs). The process that owns the job directory stays the
one writer: actors stream their outcomes back to it as they finish, exactly like local worker
processes. A lost actor (its process killed, its node gone) is noticed when a call to it fails; its
in-flight requests go back to pending and batchrun's supervisor starts a replacement, which Ray
places wherever there is room. batchrun does this rather than Ray's own actor restarts because
only the supervisor knows which requests the dead actor held (so none is lost or answered twice)
and what batch size the replacement should start with after an out-of-memory failure.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from batchrun.config import EngineSettings
from batchrun.engines.base import CacheCounting
from batchrun.errors import BatchrunError
from batchrun.openai.records import Outcome, Request
from batchrun.workers.process import Worker, WorkerDeath

# The variables the engine and the model need, passed to every actor through Ray's runtime_env:
# an actor on another node starts from that node's environment, not this process's. HF_*
# (HF_HOME, HF_HUB_CACHE, HF_TOKEN, HF_HUB_OFFLINE, HF_ENDPOINT, ...) says where and whether
# the model is found; VLLM_* and BATCHRUN_* (the model cache, fault injection) configure them.
ACTOR_ENV_PREFIXES = ("HF_", "VLLM_", "BATCHRUN_")
ACTOR_ENV_NAMES = frozenset({"HUGGING_FACE_HUB_TOKEN", "TRANSFORMERS_OFFLINE"})
# Set per machine or per worker, never to be copied to another node: VLLM_HOST_IP is this
# node's address; the worker log and CPU pinning are chosen per local worker process.
ACTOR_ENV_SKIPPED = frozenset({"VLLM_HOST_IP", "BATCHRUN_WORKER_LOG", "BATCHRUN_CPU_AFFINITY"})
INSTALL_HINT = "--ray needs Ray: pip install 'batchrun[ray]' (or pip install ray)"
# How long one poll of an actor may run the engine before it returns what finished.
POLL_S = 0.05


def import_ray() -> Any:
    """Import ray, or say how to install it."""
    try:
        import ray
    except ImportError:
        raise BatchrunError(INSTALL_HINT) from None
    return ray


def connect(address: str, workers: int | None) -> dict[str, float]:
    """Connect to the cluster at `address` ("local" starts one here); return its resources."""
    ray = import_ray()
    if not ray.is_initialized():
        try:
            if address == "local":
                # Enough CPU slots for every actor even on a small machine: echo and CPU engines
                # ask for one each, and the OS shares the cores.
                cpus = max(os.cpu_count() or 1, (workers or 1) + 1)
                ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=True)
            else:
                ray.init(address=address, log_to_driver=True)
        except Exception as e:  # Ray raises many types for "cannot connect"
            raise BatchrunError(f"cannot connect to the Ray cluster at {address}: {e}") from e
    resources: dict[str, float] = ray.cluster_resources()
    return resources


def shutdown() -> None:
    """Disconnect from Ray (stops a local instance this process started)."""
    ray = import_ray()
    if ray.is_initialized():
        ray.shutdown()


def actor_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of `environ` every actor gets (see ACTOR_ENV_PREFIXES), whatever its node."""
    return {
        name: value
        for name, value in environ.items()
        if (name.startswith(ACTOR_ENV_PREFIXES) or name in ACTOR_ENV_NAMES)
        and name not in ACTOR_ENV_SKIPPED
    }


def actor_count(resources: dict[str, float], tensor_parallel_size: int, workers: int | None) -> int:
    """One actor per GPU group in the cluster, or `workers` if given (at least one)."""
    if workers:
        return workers
    gpus = int(resources.get("GPU", 0))
    return max(1, gpus // max(1, tensor_parallel_size))


class EngineActor:
    """The body of a Ray actor: one engine, fed like a local worker (see workers/child.py)."""

    def __init__(self, settings: dict[str, Any], env: dict[str, str]) -> None:
        os.environ.update(env)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # as in a local worker
        self.settings = EngineSettings.from_dict(settings)
        self.feeder: Any = None
        # The engine's prefix-cache counters, when it counts its lookups (engines/base.py).
        self.counters: Any = None

    def start(self) -> dict[str, Any]:
        """Start the engine; report where it runs, or why it could not start."""
        import ray

        from batchrun.engines.base import create_engine
        from batchrun.engines.oom import is_oom
        from batchrun.workers.child import Feeder, peak_memory_mb

        started = time.monotonic()
        try:
            engine = create_engine(self.settings)
        except BaseException as e:  # reported to the supervisor
            return {"fatal": True, "oom": is_oom(e), "message": f"{type(e).__name__}: {e}"}
        self.feeder = Feeder(engine, self.settings.window)
        if isinstance(engine, CacheCounting):
            self.counters = engine.prefix_cache_counters
        return {
            "pid": os.getpid(),
            "node": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "gpus": [str(g) for g in ray.get_gpu_ids()],
            "start_s": time.monotonic() - started,
            "peak_memory_mb": peak_memory_mb(),
        }

    def add(self, requests: list[Request]) -> None:
        """Queue requests."""
        self.feeder.add(requests)

    def set_window(self, window: int) -> None:
        """Change the number of requests kept inside the engine."""
        self.feeder.window = window

    def poll(
        self, max_wait: float
    ) -> tuple[list[Outcome], dict[str, Any] | None, tuple[int, int] | None]:
        """Run the engine for up to `max_wait` seconds; return what finished, a fatal error, and
        the engine's prefix-cache counters (None when it keeps none)."""
        from batchrun.engines.oom import is_oom

        deadline = time.monotonic() + max_wait
        out: list[Outcome] = []
        try:
            while True:
                if self.feeder.idle:
                    time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))
                else:
                    out.extend(self.feeder.pump())
                if out or time.monotonic() >= deadline:
                    return out, None, self.counters() if self.counters is not None else None
        except BaseException as e:  # the engine is broken: say so, then die
            return out, {"oom": is_oom(e), "message": f"{type(e).__name__}: {e}"}, None


class RayWorker(Worker):
    """A worker that is a Ray actor; the scheduler drives it like a local worker process."""

    address: str = "local"

    @property
    def label(self) -> str:
        """How the worker is named in messages."""
        return f"ray worker {self.index}" + (
            f" ({self.node})" if getattr(self, "node", None) else ""
        )

    def start(self, inbox: queue.Queue[tuple[int, int, str, Any]]) -> None:
        """Create the actor and a thread that relays its outcomes to `inbox`."""
        ray = import_ray()
        gpus = float(self.settings.tensor_parallel_size) if _cluster_has_gpus(ray) else 0.0
        actor_cls = ray.remote(EngineActor)
        self.process = actor_cls.options(
            num_cpus=1,
            num_gpus=gpus,
            max_restarts=0,  # batchrun replaces a lost actor itself (see the module docstring)
            name=None,
            runtime_env={"env_vars": actor_env(os.environ)},
        ).remote(self.settings.to_dict(), self.env)
        self.conn = None
        self.pid = None
        self.node: str | None = None
        self.ready = False
        self.results = 0
        self.death = None
        self.started_at = time.monotonic()
        self.generation += 1
        self._stopping = threading.Event()
        threading.Thread(
            target=self._relay, args=(self.process, inbox, self.generation), daemon=True
        ).start()

    def _relay(self, actor: Any, inbox: queue.Queue[tuple[int, int, str, Any]], gen: int) -> None:
        ray = import_ray()
        put = inbox.put
        try:
            info = ray.get(actor.start.remote())
            if info.get("fatal"):
                put((self.index, gen, "fatal", info))
                with contextlib.suppress(Exception):
                    ray.kill(actor)
                return
            self.pid, self.node = info.get("pid"), info.get("node")
            put((self.index, gen, "ready", info))
            cache_sent = (0, 0)
            while not self._stopping.is_set():
                outcomes, fatal, cache = ray.get(actor.poll.remote(POLL_S))
                if cache is not None and cache != cache_sent:
                    # Before the results, as a local worker sends them (workers/child.py).
                    put((self.index, gen, "cache", cache))
                    cache_sent = cache
                if outcomes:
                    put((self.index, gen, "results", outcomes))
                if fatal is not None:
                    put((self.index, gen, "fatal", fatal))
                    with contextlib.suppress(Exception):
                        ray.kill(actor)
                    return
        except Exception as e:  # an actor or node lost: Ray raises its own types
            if not self._stopping.is_set():
                message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                put(
                    (
                        self.index,
                        gen,
                        "fatal",
                        {"oom": False, "message": f"the Ray actor was lost: {message}"},
                    )
                )
        finally:
            put((self.index, gen, "eof", None))

    def _on_eof(self) -> None:
        if self.death is None:
            self.death = WorkerDeath(
                oom=False, message="the Ray actor stopped", during_start=not self.ready
            )

    def describe(self) -> dict[str, Any]:
        """Where the actor runs, for `status`."""
        return {"kind": "ray", "pid": self.pid, "node": getattr(self, "node", None)}

    def send(self, requests: Sequence[Request]) -> None:
        """Hand requests to the actor (Ray keeps one caller's calls to an actor in order)."""
        for r in requests:
            self.inflight[r.custom_id] = r
        with contextlib.suppress(Exception):
            self.process.add.remote(list(requests))

    def set_window(self, window: int) -> None:
        """Change how many requests the actor keeps inside its engine."""
        self.settings.window = window
        with contextlib.suppress(Exception):
            self.process.set_window.remote(window)

    def stop(self, timeout: float = 10.0) -> None:
        """Kill the actor (an engine holds no state worth a graceful goodbye: the journal has it)."""
        if self.process is None:
            return
        self._stopping.set()
        with contextlib.suppress(Exception):
            import_ray().kill(self.process)
        self.process = None

    def kill(self) -> None:
        """Stop the actor at once."""
        self.stop()


def _cluster_has_gpus(ray: Any) -> bool:
    return bool(ray.cluster_resources().get("GPU", 0))
