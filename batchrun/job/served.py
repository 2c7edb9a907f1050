"""Which server owns a job: a job directory that is a batch of `batchrun serve` says so in its
manifest (`served_by`, stamped by the server). The core reads it here, so it never needs to know
the server's directory layout: `resume` and `retry-failed` refuse such a job (its server runs
it), `submit` will not reuse its directory, and `export` writes what finished of a batch that
ended early without --partial."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from batchrun.job.manifest import Manifest, ServedBy

# The job statuses of a batch that ended before all its requests ran: what finished is its result.
ENDED = frozenset({"cancelled", "expired", "failed"})


@dataclass(frozen=True)
class ServedBatch:
    """A job that is a batch of `batchrun serve`: the batch's id and the server's root."""

    batch_id: str
    root: Path

    def serve_command(self) -> str:
        """The command that runs the batch (again, after the server stopped)."""
        return f"batchrun serve --root {shlex.quote(str(self.root))}"

    def refusal(self, command: str) -> str:
        """Why `command` (resume, retry-failed) does not run this job."""
        return (
            f"this job is batch {self.batch_id} of `{self.serve_command()}`; it runs there "
            f"(the API's batch), not with {command}"
        )


def served_batch(manifest: Manifest) -> ServedBatch | None:
    """The batch a job is, from its manifest; None for a job of the command line."""
    owner = manifest.served_by
    return None if owner is None else ServedBatch(owner.batch_id, Path(owner.root))


def mark_served(manifest: Manifest, batch_id: str, root: Path) -> bool:
    """Record in the manifest that the server at `root` owns this job as batch `batch_id`;
    returns whether that changed anything (the caller saves the manifest)."""
    owner = ServedBy(batch_id=batch_id, root=str(root))
    if manifest.served_by == owner:
        return False
    manifest.served_by = owner
    return True
