"""The tests' shared helpers, one idea a module, imported as `support.<module>` (pyproject.toml's
pytest `pythonpath` puts tests/ on the path, for tests/vllm/ too). A helper that more than one
test module needs lives here, never in a test module; tests/conftest.py holds fixtures and hooks
only.

- paths.py: the checkout's folders (ROOT, SCRIPTS, the tests' data, fixtures and fakes).
- cli.py: `batchrun` in this process (`cli`), in a real one (`cli_process`, `start_cli`), a
  script (`run_python`); `error_line`.
- lines.py: input lines (`request_line`, `chat_line`, `model_line`, `completion_line`,
  `media_line`), input files (`chat_input`, `model_input`, `write_jsonl`), reading them back
  (`read_jsonl`, `read_lines`, `line_error`).
- jobs.py: an echo job (`submit_echo`, `start_echo`, `echo_args`, `ECHO`), `rerun` (resume,
  retry-failed), and what a job leaves (`journal_records`, `status_json`, `exported`,
  `answer_models`).
- waits.py: `wait_until`, the one way a test waits (it fails loudly), and `results_at_least`.
- processes.py: process trees and groups (`worker_pids`, `group_alive`, `kill_group`,
  `kill_9_after`).
- ports.py, models.py (`default_model_dir`), media.py, vectors.py, settings.py, reference.py
  (raw vLLM beside a job): their subjects' helpers.
- serving.py (a `batchrun serve` to drive), advice.py, openai_checks.py, s3_store.py,
  hub_cache.py; vllm_jobs.py, vllm_served.py, vllm_pooling.py, vllm_remote.py, mm_jobs.py,
  api_jobs.py: the shared real-engine jobs of tests/vllm/ (session fixtures in tests/conftest.py).
- fakes/: fake workers, GPUs (nvidia-smi, NVML), an OpenAI server, a fault proxy; powerloss/: the
  power-cut file system.
"""
