"""batchrun: crash-safe offline batches of OpenAI-format requests through vLLM.

From Python: `batchrun.run(requests, ...)`, `batchrun.submit(path, ...)` and
`batchrun.Job(job_dir)` (docs/python.md). They are imported on first use, so that `import
batchrun` stays cheap: no vLLM, torch, pandas or pyarrow until a job needs them.

`batchrun.run` is also the name of the core package (batchrun/run/: `batchrun.run.jobs`, ...),
which the import system would set as this module's attribute `run` once it is imported. So
`batchrun.run` is kept the API's: called, it runs requests; as a dotted path
(`batchrun.run.jobs`, `import batchrun.run.jobs as jobs`) it reaches the core package.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from batchrun.errors import BatchrunError
from batchrun.version import __version__

if TYPE_CHECKING:
    from batchrun.api import EngineOptions, Job, run, submit

__all__ = ["BatchrunError", "EngineOptions", "Job", "__version__", "run", "submit"]

_API = frozenset({"EngineOptions", "Job", "submit"})


def __getattr__(name: str) -> Any:
    """The Python API's names, imported the first time one is asked for."""
    if name in _API:
        from batchrun import api

        return getattr(api, name)
    raise AttributeError(f"module 'batchrun' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API, "run"})


class _Run:
    """`batchrun.run`: the Python API's `run` when called; the core package batchrun/run/ when
    a dotted path goes through it (`batchrun.run.jobs`)."""

    __name__ = "batchrun.run"  # how `import batchrun.run.jobs as x` finds the submodule

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from batchrun.api import run

        return run(*args, **kwargs)

    @property
    def __wrapped__(self) -> Any:  # inspect.signature and help() show the API's own
        from batchrun.api import run

        return run

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        doc: str | None = self.__wrapped__.__doc__
        return doc

    def __getattr__(self, name: str) -> Any:
        package = sys.modules.get("batchrun.run")
        if package is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(package, name)

    def __repr__(self) -> str:
        return "<function batchrun.run>"


class _Package(types.ModuleType):
    """This module, whose `run` stays the API's when the core package is imported."""

    @property
    def run(self) -> Any:
        return _RUN

    @run.setter
    def run(self, package: types.ModuleType) -> None:
        pass  # the import system naming batchrun/run/ here: it stays in sys.modules


_RUN = _Run()
sys.modules[__name__].__class__ = _Package
