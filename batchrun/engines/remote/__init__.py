"""The remote engine: any OpenAI-compatible server (vllm serve, SGLang, a gateway) answers the
lines; batchrun keeps its journal, passes, planner and cache around it (docs/remote.md)."""
