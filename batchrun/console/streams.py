"""Output never stops a job: a closed stdout or stderr silences batchrun instead of killing it.

`batchrun submit big.jsonl 2>&1 | head -1` closes the pipe after one line. Python then raises
BrokenPipeError from whichever print comes next (an event line, the progress bar), deep inside a
run that owns a journal and engine workers. The guards below catch that at the stream: the first
failed write points the file descriptor at /dev/null, so every later write (and the interpreter's
own flush at exit) succeeds into nowhere, and the job runs to its end. Its state and exit code, not
the terminal, say how it went.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from typing import Any, TextIO

# EPIPE: the reader went away. EIO: the terminal went away (a closed ssh session).
_GONE = (errno.EPIPE, errno.EIO)


class GuardedStream:
    """A text stream whose writes cannot fail: once its reader is gone, output goes to /dev/null."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        """Write, or drop the text when the reader is gone."""
        if self.gone:
            return len(text)
        try:
            return self._stream.write(text)
        except (OSError, ValueError) as e:
            self._on_error(e)
            return len(text)

    def flush(self) -> None:
        """Flush, or drop what is buffered when the reader is gone."""
        try:
            self._stream.flush()
        except (OSError, ValueError) as e:
            self._on_error(e)

    def _on_error(self, e: BaseException) -> None:
        if isinstance(e, OSError) and e.errno not in _GONE:
            raise e
        self.gone = True
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        # What was left in the buffer now drains into /dev/null, so the flush at exit succeeds.
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()

    def isatty(self) -> bool:
        """Whether the stream is a terminal (never once its reader is gone)."""
        if self.gone:
            return False
        try:
            return self._stream.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:
        # encoding, fileno, buffer, ...: what rich and tqdm look up, as the real stream has them.
        return getattr(self._stream, name)


def guard_std_streams() -> None:
    """Replace sys.stdout and sys.stderr with guarded streams (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, GuardedStream):
            setattr(sys, name, GuardedStream(stream))
