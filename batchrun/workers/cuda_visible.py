"""CUDA_VISIBLE_DEVICES read entry by entry as CUDA and PyTorch read it: what GPU (or MIG slice)
each entry names, and each entry that would make a job's GPUs other than what it says.

The rules (the CUDA programming guide's CUDA_VISIBLE_DEVICES, and PyTorch's
`torch.cuda._parse_visible_devices` / `_transform_uuid_to_ordinals`, which mirror the driver's):

- entries are separated by commas; an entry is an index (read as C's strtoul reads it: leading
  digits, so `1gpu2` is 1), or a `GPU-`/`MIG-` UUID or a start of one that only one GPU has;
- the list ends at the first entry that names no GPU (empty, negative, unknown, ambiguous):
  the GPUs after it are dropped without a word;
- a GPU named twice (by the same index, or by its index and its UUID, or by two starts of its
  UUID) makes PyTorch's list empty: no GPU at all;
- PyTorch reads the list as UUIDs when it starts with `GPU-`/`MIG-`, else as indices, and stops at
  the first entry of the other form: a list mixing them is fewer GPUs for PyTorch than for CUDA.

Each of these is an `EntryProblem` (the doctor names it, a run refuses it: workers/diagnosis.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from batchrun.workers.nvidia import Inventory, MigSlice, PhysicalGpu

# CUDA_VISIBLE_DEVICES values that mean "no GPU": Slurm sets NoDevFiles for a job given none;
# "-1" and "" are the usual ways to hide every GPU (CUDA stops at the first id it cannot use).
NO_GPU_VALUES = frozenset({"", "-1", "nodevfiles", "none", "void"})
# strtoul's reading of an index entry: optional sign, then digits (what follows is ignored).
_INDEX = re.compile(r"([+-]?)(\d+)")
UUID_PREFIXES = ("GPU-", "MIG-")

EMPTY = "cuda_visible_devices_empty"
UNMATCHED = "cuda_visible_devices_unmatched"
REPEATED = "cuda_visible_devices_repeated"
MIXED = "cuda_visible_devices_mixed"


def visible_entries(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES's entries as written (stripped): None for every GPU (unset, or "all"),
    [] for a value that means no GPU (NO_GPU_VALUES)."""
    if value is None or value.strip().lower() == "all":
        return None
    if value.strip().lower() in NO_GPU_VALUES:
        return []
    return [e.strip() for e in value.split(",")]


@dataclass(frozen=True)
class Named:
    """An entry and what it names: a GPU (or one slice of it); no GPU when nvidia-smi is absent
    (the entry is then taken as it is)."""

    entry: str
    gpu: PhysicalGpu | None = None
    mig: MigSlice | None = None


@dataclass(frozen=True)
class EntryProblem:
    """One entry that makes the GPUs a job gets other than the list says."""

    code: str
    position: int  # 1-based
    entry: str
    # What is wrong with it, as the end of a sentence naming the entry.
    why: str


@dataclass(frozen=True)
class Reading:
    """The GPUs CUDA_VISIBLE_DEVICES names, and its entries' problems."""

    # The entries before the first one with a problem (CUDA's list ends there), each with what
    # it names.
    named: list[Named]
    problems: list[EntryProblem]


def read_entries(entries: list[str], found: Inventory | None) -> Reading:
    """What `entries` name on the GPUs nvidia-smi lists (`found`; None: nvidia-smi is absent, and
    only what the text itself says is checked: empty entries, repeats, mixed forms)."""
    named: list[Named] = []
    problems: list[EntryProblem] = []
    if found is not None and not found.gpus:
        return Reading(named, problems)  # no GPU at all: what the list says changes nothing
    seen: dict[str, int] = {}  # what an entry names (GPU and slice UUIDs, or its text) -> position
    first_form = _form(entries[0]) if entries else "index"
    for position, entry in enumerate(entries, start=1):
        problem, item, keys = _read_one(entry, position, found, seen, first_form)
        if problem is not None:
            problems.append(problem)
            continue
        for key in keys:
            seen.setdefault(key, position)
        if not problems:  # CUDA's list ends at the first entry with a problem
            named.append(item)
    return Reading(named, problems)


def _form(entry: str) -> str:
    return "uuid" if entry.startswith(UUID_PREFIXES) else "index"


def _read_one(
    entry: str, position: int, found: Inventory | None, seen: dict[str, int], first_form: str
) -> tuple[EntryProblem | None, Named, set[str]]:
    """One entry's problem (None: it names a GPU once), what it names, and the keys of that."""
    item = Named(entry)
    if not entry:
        return EntryProblem(EMPTY, position, entry, "is empty"), item, set()
    form = _form(entry)
    if form == "index":
        index = strtoul(entry)
        if index is None:
            negative = entry.startswith("-")
            why = "is negative" if negative else "is neither an index nor a GPU-/MIG- UUID"
            return EntryProblem(UNMATCHED, position, entry, why), item, set()
        gpu = next((g for g in found.gpus if g.index == index), None) if found else None
        if found is not None and gpu is None:
            return _unmatched(entry, position, found), item, set()
        keys = _keys(gpu, None) if gpu is not None else {f"index {index}"}
        item = Named(entry, gpu)
    else:
        if found is None:
            keys = {entry}
            # Two starts of one UUID name the same GPU when the shorter one names any.
            earlier = next((k for k in seen if k.startswith(entry) or entry.startswith(k)), None)
            if earlier is not None:
                keys.add(earlier)
        else:
            hits = _uuid_hits(entry, found)
            if len(hits) != 1:
                if not hits:
                    return _unmatched(entry, position, found), item, set()
                why = f"is the start of more than one UUID ({len(hits)} of them), so it names none"
                return EntryProblem(UNMATCHED, position, entry, why), item, set()
            gpu, mig = hits[0]
            keys = _keys(gpu, mig)
            item = Named(entry, gpu, mig)
    again = sorted(seen[k] for k in keys if k in seen)
    if again:
        what = f"GPU {item.gpu.index}" if item.gpu is not None else "the same GPU"
        if item.mig is not None:
            what = f"MIG slice {item.mig.uuid}"
        why = f"names {what} again (as entry {again[0]} does)"
        return EntryProblem(REPEATED, position, entry, why), item, keys
    if form != first_form:
        why = (
            f"is {'a UUID' if form == 'uuid' else 'an index'} in a list of "
            f"{'indices' if first_form == 'index' else 'UUIDs'}: PyTorch reads the list as "
            f"{'indices' if first_form == 'index' else 'UUIDs'} and stops there"
        )
        return EntryProblem(MIXED, position, entry, why), item, keys
    return None, item, keys


def _unmatched(entry: str, position: int, found: Inventory) -> EntryProblem:
    listed = ", ".join(str(g.index) for g in found.gpus) or "none"
    return EntryProblem(UNMATCHED, position, entry, f"names no GPU nvidia-smi lists ({listed})")


def _keys(gpu: PhysicalGpu, mig: MigSlice | None) -> set[str]:
    """What an entry naming `gpu` (or its slice `mig`) takes: a whole GPU takes its slices too."""
    if mig is not None:
        return {mig.uuid}
    return {gpu.uuid, *(s.uuid for s in gpu.migs)}


def _uuid_hits(entry: str, found: Inventory) -> list[tuple[PhysicalGpu, MigSlice | None]]:
    """The GPUs and slices whose UUID starts with `entry` (CUDA takes a unique start)."""
    hits: list[tuple[PhysicalGpu, MigSlice | None]] = []
    for gpu in found.gpus:
        if gpu.uuid.startswith(entry):
            hits.append((gpu, None))
        hits.extend((gpu, s) for s in gpu.migs if s.uuid.startswith(entry))
    return hits


def strtoul(entry: str) -> int | None:
    """An index entry as CUDA reads it: its leading digits (`1gpu2` is 1); None for none, or a
    negative one (which ends CUDA's list)."""
    found = _INDEX.match(entry)
    if found is None or (found.group(1) == "-" and int(found.group(2)) != 0):
        return None
    return int(found.group(2))
