"""The commands' options, declared once: each option's flag, environment variable, type, range or
choices, default shown and help (`option.py`: the `Option` record; `engine.py`: the engine
options of submit, tune, resume and retry-failed; `metrics.py`: the metrics options of submit,
resume and retry-failed).

The CLI (cli/) makes its Typer parameters of them; the Python API (api/) converts each value it
is given through the same click parameter (`values.py`), so that a bad value is refused in the
CLI's own line. Nothing here imports click or Typer until an option is made or converted:
`import batchrun` and the API's first use stay cheap.
"""
