"""How CPU engine workers share this process's cores: OpenMP threads and the cores each pins
itself to, one thread per physical core, leaving cores other live batchrun jobs hold
(workers/cpu_claims.py)."""

from __future__ import annotations

import os

from batchrun.workers.cpu_claims import hold_claim, live_claims, release_claim


def cpu_worker_envs(
    count: int, topology: str = "/sys/devices/system/cpu", job: str = ""
) -> list[dict[str, str]]:
    """Share this process's cores among `count` CPU engine workers: OpenMP threads and affinity.

    Every core goes to the model. vLLM's own multiprocess engine keeps a core back for its
    scheduler process, which polls without sleeping; batchrun runs the engine core inside the
    worker, and the parent sleeps on its pipe between results (measured on 2 cores: the model on
    both gave 1.4-1.5x the generation throughput of the model on one, parent and all). One
    thread per physical core, as vLLM binds them on x86: two threads on one core's hyperthreads
    only share its arithmetic units. Each worker gets OMP_NUM_THREADS and the cores to pin itself
    to (BATCHRUN_CPU_AFFINITY, applied by the worker before torch loads).

    Cores another live batchrun job on this machine holds (workers/cpu_claims.py) are left to
    it while others are free; when none is, the workers share them and BATCHRUN_CPU_SHARED_WITH
    names the other jobs, for the scheduler to say so. A user's own OMP_NUM_THREADS sets the
    threads of each worker, pinned to that many free cores (unpinned when fewer are free), so
    jobs given their shares that way get cores of their own; VLLM_CPU_OMP_THREADS_BIND leaves
    it all to the user.
    """
    asked = os.environ.get("OMP_NUM_THREADS")
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ or (asked is not None and _count(asked) is None):
        release_claim()  # the user places the threads: this job holds no cores of its own
        return [{} for _ in range(count)]
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return [{} for _ in range(count)]
    usable = physical_cores(cpus, topology)
    others = live_claims()
    taken = {core for claim in others for core in claim.cores}
    free = [core for core in usable if core not in taken]
    if asked is not None:
        per = _count(asked) or 1
        if per * count > len(free):
            release_claim()
            return [{} for _ in range(count)]  # the user's threads, where the kernel puts them
        usable, shared = free[: per * count], []
    else:
        shared = [claim for claim in others if set(claim.cores) & set(usable)] if not free else []
        usable = free or usable
        per = max(1, len(usable) // count)
    envs = []
    for i in range(count):
        mine = usable[i * per : (i + 1) * per] or usable[-per:]
        env = {"OMP_NUM_THREADS": str(len(mine)), "BATCHRUN_CPU_AFFINITY": ",".join(map(str, mine))}
        if shared:
            env["BATCHRUN_CPU_SHARED_WITH"] = "; ".join(
                f"pid {c.pid}" + (f", {c.job}" if c.job else "") for c in shared
            )
        envs.append(env)
    hold_claim(usable, job)
    return envs


def _count(text: str) -> int | None:
    """OMP_NUM_THREADS as one positive count (None for OpenMP's lists, "2,1", and the like)."""
    text = text.strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def physical_cores(cpus: list[int], topology: str = "/sys/devices/system/cpu") -> list[int]:
    """The first of `cpus` on each physical core (hyperthreads' siblings left out); all of them
    where Linux's topology files cannot be read."""
    seen: set[tuple[str, str]] = set()
    chosen: list[int] = []
    for cpu in cpus:
        try:
            base = f"{topology}/cpu{cpu}/topology"
            with open(f"{base}/physical_package_id") as f:
                package = f.read().strip()
            with open(f"{base}/core_id") as f:
                core = f.read().strip()
        except OSError:
            return list(cpus)
        if (package, core) not in seen:
            seen.add((package, core))
            chosen.append(cpu)
    return chosen
