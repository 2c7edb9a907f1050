"""The tests' shared helpers, one idea a module (imported as `support.<module>`: pytest puts tests/
on the path, pyproject.toml's `pythonpath`). A helper that two test modules need lives here, never
in a test module; tests/conftest.py holds only fixtures and hooks.

- paths.py: the checkout's folders (ROOT, the tests' data, fixtures and fakes).
- cli.py: `batchrun` in this process (`cli`), in a real one (`cli_process`, `start_cli`).
- lines.py: input lines and JSONL files (`chat_line`, `chat_input`, `write_jsonl`, `read_jsonl`).
- jobs.py: an echo job (`submit_echo`, `start_echo`) and what it leaves (`journal_records`,
  `outputs`, `status_json`).
- waits.py: `wait_until`, the one way a test waits, and its conditions.
- processes.py: process trees and groups (`worker_pids`, `group_alive`).
- reference.py: raw vLLM run beside a job (`reference_run`).
- serving.py: a `batchrun serve` to drive; advice.py, openai_checks.py, s3_store.py,
  hub_cache.py: their subjects' helpers; vllm_*.py, mm_jobs.py, api_jobs.py: the shared
  real-engine jobs of tests/vllm/ (the session fixtures of tests/conftest.py).
- fakes/: fake workers, GPUs (nvidia-smi, NVML), OpenAI servers; powerloss/: the power-cut file
  system.
"""
