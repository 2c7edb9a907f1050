"""The dtype the vLLM engine loads when the user leaves it to batchrun."""

from __future__ import annotations


def test_auto_dtype_is_float32_on_a_cpu_without_bf16() -> None:
    from batchrun.engines.vllm.dtype import resolve_dtype

    no_bf16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"
    bf16 = "flags\t\t: fpu avx2 avx512f avx512_bf16\n"
    assert resolve_dtype("auto", cuda=False, cpuinfo=no_bf16) == "float32"
    assert resolve_dtype("auto", cuda=False, cpuinfo=bf16) == "auto"
    assert resolve_dtype("auto", cuda=True, cpuinfo=no_bf16) == "auto"
    assert resolve_dtype("bfloat16", cuda=False, cpuinfo=no_bf16) == "bfloat16"
