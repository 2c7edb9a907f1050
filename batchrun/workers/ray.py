"""Engine workers as Ray actors: the same scheduler, journal and guarantees, spread over a cluster.

Ray places each actor where its resources are (one GPU, or a tensor-parallel group of them, per
actor; CPU only when the cluster has no GPUs). The process that owns the job directory stays the
one writer: actors stream their outcomes back to it as they finish, exactly like local worker
processes. A lost actor (its process killed, its node gone) is noticed when a call to it fails; its
in-flight requests go back to pending and batchrun's supervisor starts a replacement, which Ray
places wherever there is room. batchrun does this rather than Ray's own actor restarts because
only the supervisor knows which requests the dead actor held (so none is lost or answered twice)
and what batch size the replacement should start with after an out-of-memory failure.

On a GPU cluster each actor gets a placement group of its own: one bundle of
tensor_parallel_size GPUs (and a CPU) on one node, reserved whole before the actor starts. A
cluster with no node that big is refused before any actor is made, and every wait of a start is
bounded (workers/ray_start.py). Ray's memory monitor killing an actor (the node ran low on host
memory) counts as out of memory, as a CUDA OOM does: the replacement backs off.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from batchrun.config import EngineSettings
from batchrun.engines.base import CacheCounting
from batchrun.errors import BatchrunError
from batchrun.job.shards import ShardWriter, new_shard_name, seen_shards
from batchrun.openai.records import Outcome, Request
from batchrun.workers import ray_start
from batchrun.workers.messages import (
    Cache,
    Eof,
    Fatal,
    Heartbeat,
    Inbox,
    PollReply,
    Ready,
    Results,
    Stats,
)
from batchrun.workers.platform_env import is_cpu_only as platform_cpu_only
from batchrun.workers.platform_env import platform_settings
from batchrun.workers.process import Worker, WorkerDeath
from batchrun.workers.ray_start import StartTimeout

# The variables the engine and the model need, passed to every actor through Ray's runtime_env:
# an actor on another node starts from that node's environment, not this process's. HF_*
# (HF_HOME, HF_HUB_CACHE, HF_TOKEN, HF_HUB_OFFLINE, HF_ENDPOINT, ...) says where and whether
# the model is found; VLLM_* and BATCHRUN_* (the model cache BATCHRUN_HOME, fault injection)
# configure them.
ACTOR_ENV_PREFIXES = ("HF_", "VLLM_", "BATCHRUN_")
ACTOR_ENV_NAMES = frozenset({"HUGGING_FACE_HUB_TOKEN", "TRANSFORMERS_OFFLINE"})
# Set per machine or per worker, never to be copied to another node: VLLM_HOST_IP is this
# node's address; the worker log and CPU pinning are chosen per local worker process.
ACTOR_ENV_SKIPPED = frozenset({"VLLM_HOST_IP", "BATCHRUN_WORKER_LOG", "BATCHRUN_CPU_AFFINITY"})
# Settings of this machine's CPUs (the driver's): vLLM's CPU backend (VLLM_CPU_KVCACHE_SPACE,
# VLLM_CPU_OMP_THREADS_BIND, ...), OpenMP's threads, batchrun's core claims. An engine on a GPU
# node must not get them: a CPU head's thread binding or KV space means nothing there, or worse.
CPU_ONLY_PREFIXES = ("VLLM_CPU_", "BATCHRUN_CPU_")
CPU_ONLY_NAMES = frozenset({"OMP_NUM_THREADS"})
# How often an actor's memory is asked for, as a local worker sends its own (workers/child.py).
STATS_EVERY_S = 2.0
# Ray's words when its memory monitor kills a worker (the actor, or the task it ran): "Memory on
# the node (IP: ..., ID: ...) was ...GB used / ...GB limit", "OOM kill reason: ...", "... were
# killed due to the node running low on memory". Not "OOM killer": Ray's message for any
# unexplained death mentions the kernel's OOM killer among its possible causes.
RAY_OOM_FRAGMENTS = ("memory on the node (ip:", "oom kill reason", "running low on memory")
INSTALL_HINT = "--ray needs Ray: pip install 'batchrun[ray]' (or pip install ray)"
# How long one poll of an actor may run the engine before it returns what finished.
POLL_S = 0.05
# How often the relay tells the scheduler the actor's engine is still stepping.
HEARTBEAT_S = 1.0


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


def cluster_device_key(resources: Mapping[str, float], tensor_parallel_size: int) -> str:
    """The batch-size cache key's device for actors on a cluster with `resources`: the GPU
    models Ray found on its nodes (its accelerator_type resources) and the GPUs per actor, never
    the driver's own device; "cpu" for a cluster without GPUs."""
    if resources.get("GPU", 0) <= 0:
        return "cpu"
    kinds = sorted(k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:"))
    tp = max(1, tensor_parallel_size)
    return f"ray:cuda:{'+'.join(kinds) or 'gpu'}" + (f" x{tp}" if tp > 1 else "")


def shutdown() -> None:
    """Disconnect from Ray (stops a local instance this process started)."""
    ray = import_ray()
    if ray.is_initialized():
        ray.shutdown()


def actor_env(environ: Mapping[str, str], *, gpus: bool = False) -> dict[str, str]:
    """The part of `environ` every actor gets (see ACTOR_ENV_PREFIXES), whatever its node; for
    actors on GPUs, without this machine's CPU-only settings (CPU_ONLY_PREFIXES)."""
    return {
        name: value
        for name, value in environ.items()
        if (name.startswith(ACTOR_ENV_PREFIXES) or name in ACTOR_ENV_NAMES)
        and name not in ACTOR_ENV_SKIPPED
        and not (name.startswith("BATCHRUN_CPU_") or (gpus and is_cpu_only(name)))
    }


def is_cpu_only(name: str) -> bool:
    """Whether the variable `name` tunes the CPUs of the machine it is set on (never for GPUs):
    a local CPU worker's (workers/platform_env.py), or batchrun's core claims."""
    return name.startswith(CPU_ONLY_PREFIXES) or name in CPU_ONLY_NAMES or platform_cpu_only(name)


def node_gpus() -> list[float]:
    """The GPUs of each live node of the connected cluster."""
    return ray_start.node_gpus(import_ray())


def actor_count(
    gpus_per_node: Sequence[float], tensor_parallel_size: int, workers: int | None
) -> int:
    """One actor per GPU group that fits on a node, or `workers` if given (at least one);
    a tensor-parallel size no node can hold is refused (see workers/ray_start.py)."""
    return ray_start.actor_count(gpus_per_node, tensor_parallel_size, workers)


def death_is_oom(exc: BaseException) -> bool:
    """Whether a failed call to an actor means out of memory: Ray's OutOfMemoryError (its memory
    monitor killed the task), an actor it killed for memory, or an OOM the engine raised."""
    from batchrun.engines.oom import is_oom

    if is_oom(exc):  # ray.exceptions.OutOfMemoryError is one by its name
        return True
    try:
        text = str(exc).lower()
    except Exception:  # a broken __str__ must not turn classification into a crash
        return False
    return any(fragment in text for fragment in RAY_OOM_FRAGMENTS)


class EngineActor:
    """The body of a Ray actor: one engine, fed like a local worker (see workers/child.py)."""

    def __init__(self, settings: dict[str, Any], env: dict[str, str]) -> None:
        import ray

        os.environ.update(env)
        # The GPUs Ray gave this actor (its placement group's), as CUDA_VISIBLE_DEVICES names them.
        self.gpus = [str(g) for g in ray.get_gpu_ids()]
        if self.gpus:
            # On a local cluster an actor inherits the driver's environment (its raylet's), which
            # runtime_env cannot take away: CPU-only settings of the driver's machine go here.
            for name in [n for n in os.environ if is_cpu_only(n)]:
                del os.environ[name]
            # As a local GPU worker's (workers/platform_env.py): ranks spawned, INFO log.
            for name, value in platform_settings("cuda").items():
                os.environ.setdefault(name, value)
        else:
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # as in a local worker
        self.settings = EngineSettings.from_dict(settings)
        # Where this actor writes its results' bodies, if its node sees the job directory
        # (job/shards.py); None: they travel whole, in its replies.
        shards = seen_shards(env)
        self.shard = ShardWriter(shards, new_shard_name("ray")) if shards else None
        self.feeder: Any = None
        # The engine's prefix-cache counters, when it counts its lookups (engines/base.py).
        self.counters: Any = None
        # The most memory in use seen on each of its GPUs (NVML), in MiB.
        self.gpu_peaks: list[float] | None = None

    def start(self) -> Ready | Fatal:
        """Start the engine; report where it runs, or why it could not start."""
        import ray

        from batchrun.engines.base import create_engine
        from batchrun.engines.oom import is_oom
        from batchrun.workers.child import Feeder

        started = time.monotonic()
        try:
            engine = create_engine(self.settings)
        except BaseException as e:  # reported to the supervisor
            return Fatal(oom=is_oom(e), message=f"{type(e).__name__}: {e}")
        # --request-timeout holds on Ray as on a local worker: the engine aborts the request.
        self.feeder = Feeder(engine, self.settings.window, self.settings.request_timeout)
        if isinstance(engine, CacheCounting):
            self.counters = engine.prefix_cache_counters
        return Ready(
            pid=os.getpid(),
            start_s=time.monotonic() - started,
            peak_memory_mb=self.stats().peak_memory_mb,
            sampling_defaults=getattr(engine, "sampling_defaults", None),
            node=ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            gpus=self.gpus,
        )

    def stats(self) -> Stats:
        """Peak memory: the most in use on any one of its GPUs (NVML) when it has GPUs and NVML
        reads them (the engine's ranks and engine process are not this process), else this
        process's own peak (workers/child.py)."""
        from batchrun.workers.child import peak_memory_mb
        from batchrun.workers.gpu_memory import gpu_memory_mb

        used = gpu_memory_mb(self.gpus)
        if used is None:
            return Stats(peak_memory_mb())
        peaks = self.gpu_peaks or [0.0] * len(used)
        self.gpu_peaks = [max(a, b) for a, b in zip(peaks, used, strict=True)]
        return Stats(max(self.gpu_peaks), gpu_memory_mb=self.gpu_peaks)

    def add(self, requests: list[Request]) -> None:
        """Queue requests."""
        self.feeder.add(requests)

    def set_window(self, window: int) -> None:
        """Change the number of requests kept inside the engine."""
        self.feeder.window = window

    def poll(self, max_wait: float) -> PollReply:
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
                    _encode_bodies(out)
                    if self.shard is not None and self.shard.store(out):
                        # On the disk before the parent hears where (job/shards.py).
                        self.shard.sync()
                    counters = self.counters() if self.counters is not None else None
                    return PollReply(out, cache=None if counters is None else Cache(*counters))
        except BatchrunError as e:  # the shard cannot be written: no restart can help
            return PollReply([], fatal=Fatal(oom=False, message=str(e), stops_job=True))
        except BaseException as e:  # the engine is broken: say so, then die
            return PollReply(out, fatal=Fatal(oom=is_oom(e), message=f"{type(e).__name__}: {e}"))


def _encode_bodies(out: list[Outcome]) -> None:
    """Each body as its journal JSON, an embeddings body's vectors split out, here in the
    actor as a worker process does (workers/child.py): the parent writes them as they are."""
    from batchrun.workers.child import encode_outcome

    for outcome in out:
        if type(outcome.body) is dict:
            outcome.body = encode_outcome(outcome, outcome.body)


class RayWorker(Worker):
    """A worker that is a Ray actor; the scheduler drives it like a local worker process."""

    address: str = "local"
    start_watched: ClassVar[bool] = False

    @property
    def label(self) -> str:
        """How the worker is named in messages."""
        return f"ray worker {self.index}" + (
            f" ({self.node})" if getattr(self, "node", None) else ""
        )

    def start(self, inbox: Inbox) -> None:
        """Create the actor (in a placement group of its own on a GPU cluster) and a thread that
        waits for it to start, then relays its outcomes to `inbox`."""
        ray = import_ray()
        timeouts = ray_start.start_timeouts(self.settings.start_timeout)
        on_gpus = _cluster_has_gpus(ray)
        tp = self.settings.tensor_parallel_size
        options: dict[str, Any] = {
            "num_cpus": 1,
            "num_gpus": float(tp) if on_gpus else 0.0,
            "max_restarts": 0,  # batchrun replaces a lost actor itself (see the module docstring)
            "name": None,
            "runtime_env": {"env_vars": actor_env(os.environ, gpus=on_gpus)},
        }
        self.placement: Any = None
        if on_gpus:
            self.placement = ray_start.reserve(tp)
            options["scheduling_strategy"] = ray_start.placed(self.placement)
        self.process = (
            ray.remote(EngineActor).options(**options).remote(self.settings.to_dict(), self.env)
        )
        self.pid = None
        self.node: str | None = None
        self.ready = False
        self.results = 0
        self.death = None
        self.started_at = time.monotonic()
        self.generation += 1
        self._stopping = threading.Event()
        threading.Thread(
            target=self._relay,
            args=(self.process, self.placement, timeouts, inbox, self.generation),
            daemon=True,
        ).start()

    def _await_start(
        self, ray: Any, actor: Any, placement: Any, timeouts: ray_start.StartTimeouts
    ) -> Ready | Fatal:
        """Wait, each step bounded, for the placement group, the actor, then its engine."""
        if placement is not None:
            tp = self.settings.tensor_parallel_size
            ray_start.wait(
                ray,
                placement.ready(),
                timeouts.placement,
                f"the placement group of {self.label} ({tp} GPU{'s' if tp != 1 else ''} and "
                "1 CPU on one node) to be placed: no node has that much free",
            )
        ray_start.wait(
            ray,
            actor.__ray_ready__.remote(),
            timeouts.actor,
            f"the Ray actor of {self.label} to be created",
        )
        info: Ready | Fatal = ray_start.wait(
            ray, actor.start.remote(), timeouts.engine, f"the engine of {self.label} to start"
        )
        return info

    def _relay(
        self,
        actor: Any,
        placement: Any,
        timeouts: ray_start.StartTimeouts,
        inbox: Inbox,
        gen: int,
    ) -> None:
        ray = import_ray()
        put = inbox.put
        try:
            info = self._await_start(ray, actor, placement, timeouts)
            if isinstance(info, Fatal):
                put((self.index, gen, info))
                self._discard(ray, actor, placement)
                return
            self.pid, self.node = info.pid, info.node
            put((self.index, gen, info))
            cache_sent = Cache(0, 0)
            stats_at = beat_at = time.monotonic()
            # Heartbeats as a local worker's (workers/child.py): a poll that returns is an engine
            # still stepping, so the stall watchdog (run/watchdog.py) watches actors too; a poll
            # stuck in a hung engine step sends none.
            put((self.index, gen, Heartbeat(HEARTBEAT_S)))
            while not self._stopping.is_set():
                reply: PollReply = ray.get(actor.poll.remote(POLL_S))
                if time.monotonic() - beat_at >= HEARTBEAT_S:
                    put((self.index, gen, Heartbeat(HEARTBEAT_S)))
                    beat_at = time.monotonic()
                if reply.cache is not None and reply.cache != cache_sent:
                    # Before the results, as a local worker sends them (workers/child.py).
                    put((self.index, gen, reply.cache))
                    cache_sent = reply.cache
                if reply.outcomes:
                    put((self.index, gen, Results(reply.outcomes)))
                if reply.fatal is not None:
                    put((self.index, gen, reply.fatal))
                    self._discard(ray, actor, placement)
                    return
                if time.monotonic() - stats_at >= STATS_EVERY_S:
                    put((self.index, gen, ray.get(actor.stats.remote())))
                    stats_at = time.monotonic()
        except StartTimeout as e:
            if not self._stopping.is_set():
                put((self.index, gen, Fatal(oom=False, message=str(e))))
            self._discard(ray, actor, placement)
        except Exception as e:  # an actor or node lost: Ray raises its own types
            if not self._stopping.is_set():
                put((self.index, gen, lost(e)))
        finally:
            put((self.index, gen, Eof()))

    @staticmethod
    def _discard(ray: Any, actor: Any, placement: Any) -> None:
        """Kill the actor and give its GPUs back."""
        with contextlib.suppress(Exception):
            ray.kill(actor)
        if placement is not None:
            ray_start.release(placement)

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

    def stop(self, timeout: float = 10.0, *, leave: bool = False) -> None:
        """Kill the actor (an engine holds no state worth a graceful goodbye: the journal has it;
        `leave` changes nothing: nothing waits for the actor's end)."""
        if self.process is None:
            return
        self._stopping.set()
        self._discard(import_ray(), self.process, getattr(self, "placement", None))
        self.process = None
        self.placement = None

    def kill(self) -> None:
        """Stop the actor at once."""
        self.stop()


def lost(exc: BaseException) -> Fatal:
    """The fatal report for a failed call to an actor: out of memory when Ray's memory monitor
    killed it (its words about memory quoted), else "lost" with the first line of Ray's words."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if death_is_oom(exc):
        said = next(
            (line for line in lines if any(f in line.lower() for f in RAY_OOM_FRAGMENTS)),
            lines[0] if lines else type(exc).__name__,
        )
        return Fatal(oom=True, message=f"Ray killed the actor for memory: {said}")
    message = lines[0] if lines else type(exc).__name__
    return Fatal(oom=False, message=f"the Ray actor was lost: {message}")


def _cluster_has_gpus(ray: Any) -> bool:
    return bool(ray.cluster_resources().get("GPU", 0))
