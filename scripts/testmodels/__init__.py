"""Tiny models built on the spot, with random weights under a fixed seed (no model hub): the
multimodal ones (multimodal.py) and LoRA adapters (lora.py), for the tests and the benchmarks."""
