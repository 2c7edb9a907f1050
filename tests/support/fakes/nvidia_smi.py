"""A fake `nvidia-smi` for tests: answers the calls batchrun makes from a JSON description.

FAKE_NVIDIA_SMI names a JSON file: {"gpus": [{"name", "uuid", "memory_mib", "mig": [{"profile",
"uuid"}]}], "driver": "550.54.15", "cuda": "12.4", "fail": {"code", "message"} (every call
fails so), "hang": true (every call sleeps until killed), "calls": a file each call's arguments
are appended to}. Tests put a wrapper called nvidia-smi first on PATH (tests/support/fakes/gpus.py).
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    with open(os.environ["FAKE_NVIDIA_SMI"]) as f:
        spec = json.load(f)
    if spec.get("calls"):
        with open(spec["calls"], "a") as f:
            f.write(" ".join(argv) + "\n")
    if spec.get("hang"):
        while True:
            time.sleep(60)
    fail = spec.get("fail")
    if fail:
        sys.stdout.write(fail.get("message", "") + "\n")
        return int(fail.get("code", 9))
    gpus = spec.get("gpus", [])
    driver, cuda = spec.get("driver", "550.54.15"), spec.get("cuda", "12.4")
    if argv == ["-L"]:
        for i, gpu in enumerate(gpus):
            print(f"GPU {i}: {gpu['name']} (UUID: {gpu['uuid']})")
            for j, mig in enumerate(gpu.get("mig", [])):
                print(f"  MIG {mig['profile']:<11} Device {j:>2}: (UUID: {mig['uuid']})")
        return 0
    query = next((a for a in argv if a.startswith("--query-gpu=")), None)
    if query is not None:
        fields = query.split("=", 1)[1].split(",")
        for i, gpu in enumerate(gpus):
            values = {
                "index": str(i),
                "uuid": gpu["uuid"],
                "name": gpu["name"],
                "memory.total": str(gpu.get("memory_mib", 81559)),
                "memory.used": str(gpu.get("used_mib", 0)),
                "driver_version": driver,
            }
            print(", ".join(values[f] for f in fields))
        return 0
    if not argv:
        print("+-----------------------------------------------------------------------------+")
        print(f"| NVIDIA-SMI {driver}    Driver Version: {driver}    CUDA Version: {cuda}     |")
        print("+-----------------------------------------------------------------------------+")
        return 0
    sys.stderr.write(f"fake nvidia-smi: unknown arguments {argv}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
