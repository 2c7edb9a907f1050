"""The dtype the vLLM engine loads when the user leaves it to batchrun."""

from __future__ import annotations


def resolve_dtype(dtype: str, *, cuda: bool, cpuinfo: str | None = None) -> str:
    """The dtype to load: "auto" becomes float32 on a CPU without native bf16 arithmetic.

    vLLM's "auto" takes the checkpoint's bf16, which a CPU without AVX512-BF16 or AMX emulates
    (oneDNN falls back to plain torch linear layers); float32 measured faster there. Anything the
    user names is passed through untouched.
    """
    if dtype != "auto" or cuda:
        return dtype
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return dtype
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
            break
    if not flags:
        return dtype
    return dtype if {"avx512_bf16", "amx_bf16"} & flags else "float32"
