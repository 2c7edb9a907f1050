"""What holds GPU memory, as nvidia-smi lists it: named when an engine cannot start for want of
free memory, so that the message says whose memory it is, not only that it is taken."""

from __future__ import annotations

import shutil
import subprocess

# nvidia-smi hangs on a GPU fallen off the bus: this message must not hang with it.
_TIMEOUT_S = 10.0
_QUERY = (
    "--query-compute-apps=pid,process_name,used_memory",
    "--format=csv,noheader,nounits",
)
# The most processes named in one message (the rest are counted).
_SHOWN = 5


def parse_compute_apps(text: str) -> list[tuple[int, str, int | None]]:
    """(pid, process name, MiB used) of each line of nvidia-smi's compute-apps CSV."""
    apps: list[tuple[int, str, int | None]] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        name = ", ".join(parts[1:-1])  # a process name may itself hold a comma
        used = parts[-1]
        apps.append((int(parts[0]), name, int(used) if used.isdigit() else None))
    return apps


def memory_holders() -> str:
    """One phrase saying which processes hold GPU memory, or why that is not known."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi is not on PATH, so what holds the memory is not known"
    try:
        done = subprocess.run(
            [exe, *_QUERY],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"nvidia-smi did not answer within {_TIMEOUT_S:.0f}s, so what holds it is not known"
    except OSError as exc:
        return f"nvidia-smi could not run ({exc}), so what holds the memory is not known"
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split())[:200]
        return f"nvidia-smi failed (exit code {done.returncode}: {said or 'no output'})"
    apps = parse_compute_apps(done.stdout)
    if not apps:
        return "nvidia-smi lists no process holding GPU memory (it may be freeing it)"
    shown = ", ".join(
        f"pid {pid} {name} ({used if used is not None else '?'} MiB)"
        for pid, name, used in apps[:_SHOWN]
    )
    more = f" and {len(apps) - _SHOWN} more" if len(apps) > _SHOWN else ""
    return f"held by {shown}{more}"
