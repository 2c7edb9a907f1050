"""Starting engine actors on a Ray cluster without hanging: where they can go, and how long to wait.

Ray waits forever for resources it does not have: an actor asking for 2 GPUs on a cluster of
1-GPU nodes is "infeasible" and simply never starts. So before any actor is made, the cluster's
nodes are checked for one with the GPUs a worker needs (tensor parallelism runs every rank of one
engine on one node), and every wait after that (the placement group, the actor, the engine) has a
bound, past which the worker's start fails with a message naming what it waited for.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from batchrun.config import DEFAULT_START_TIMEOUT
from batchrun.console.text import plural
from batchrun.errors import BatchrunError

# Resources the cluster has, free, are reserved in seconds; a busy cluster frees them as its
# other work ends. Past this, more waiting is unlikely to help.
PLACEMENT_S = 120.0


@dataclass(frozen=True)
class StartTimeouts:
    """How long each step of an actor's start may take, in seconds."""

    placement: float = PLACEMENT_S
    actor: float = PLACEMENT_S
    # Loading a big model onto GPUs takes minutes; compiling CUDA graphs, more.
    engine: float = DEFAULT_START_TIMEOUT


class StartTimeout(Exception):
    """A step of an actor's start did not finish in time (the message says which)."""


def start_timeouts(start_timeout: float | None) -> StartTimeouts:
    """The bounds on an actor's start: `--start-timeout` (BATCHRUN_START_TIMEOUT) seconds for
    every step when given, else the defaults above."""
    if start_timeout is None:
        return StartTimeouts()
    return StartTimeouts(start_timeout, start_timeout, start_timeout)


def node_gpus(ray: Any) -> list[float]:
    """The GPUs of each live node of the connected cluster (all of them, busy or not)."""
    return [
        float(node.get("Resources", {}).get("GPU", 0))
        for node in ray.nodes()
        if node.get("Alive", node.get("alive", True))
    ]


def check_fits(gpus_per_node: Sequence[float], tensor_parallel_size: int) -> None:
    """Refuse a tensor-parallel size that no node of a GPU cluster can hold (a cluster without
    GPUs runs its actors on CPUs, where the check does not apply).

    Raises:
        BatchrunError: no node has `tensor_parallel_size` GPUs.
    """
    largest = max(gpus_per_node, default=0.0)
    if largest <= 0 or largest >= tensor_parallel_size:
        return
    with_gpus = Counter(int(g) for g in gpus_per_node if g > 0)
    nodes = ", ".join(
        f"{plural(count, 'node')} with {plural(size, 'GPU')}"
        for size, count in sorted(with_gpus.items(), reverse=True)
    )
    raise BatchrunError(
        f"--tensor-parallel-size {tensor_parallel_size} needs {tensor_parallel_size} GPUs on one "
        f"node, and no node of the Ray cluster has that many ({nodes}); use "
        f"--tensor-parallel-size {int(largest)} or less, or add a node with "
        f"{tensor_parallel_size} GPUs"
    )


def actor_count(
    gpus_per_node: Sequence[float], tensor_parallel_size: int, workers: int | None
) -> int:
    """One actor per group of `tensor_parallel_size` GPUs that fits on a node, or `workers` if
    given (at least one); refused first when no node can hold one group (see check_fits)."""
    tp = max(1, tensor_parallel_size)
    check_fits(gpus_per_node, tp)
    if workers:
        return workers
    return max(1, sum(int(g) // tp for g in gpus_per_node))


def reserve(gpus: int) -> Any:
    """A placement group for one worker: one bundle of `gpus` GPUs and a CPU, all on one node
    (STRICT_PACK), so that every rank of its engine sits beside the others."""
    from ray.util.placement_group import placement_group

    return placement_group([{"GPU": float(gpus), "CPU": 1.0}], strategy="STRICT_PACK")


def placed(group: Any) -> Any:
    """The scheduling strategy that puts an actor into `group`'s bundle."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(
        placement_group=group,
        placement_group_bundle_index=0,
        # Whatever the engine starts as Ray tasks stays inside the worker's reservation.
        placement_group_capture_child_tasks=True,
    )


def release(group: Any) -> None:
    """Give a placement group back (a pending one stops being waited for)."""
    from ray.util.placement_group import remove_placement_group

    # Already gone, or the cluster is: nothing is held either way.
    with contextlib.suppress(Exception):
        remove_placement_group(group)


def wait(ray: Any, ref: Any, timeout: float, what: str) -> Any:
    """`ray.get(ref)`, for at most `timeout` seconds.

    Raises:
        StartTimeout: naming `what` was waited for, and how to wait longer.
    """
    try:
        return ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise StartTimeout(
            f"timed out after {timeout:g}s waiting for {what}; raise --start-timeout "
            "(BATCHRUN_START_TIMEOUT) to wait longer"
        ) from None
