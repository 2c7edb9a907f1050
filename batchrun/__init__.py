"""batchrun: crash-safe offline batches of OpenAI-format requests through vLLM."""

__version__ = "0.1.0"
