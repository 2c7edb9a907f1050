"""The advice after a run that left failed requests: `retry-failed` for the failures a retry may
fix, and for those it cannot (job/lasting.py) what can: a longer context, or the input."""

from __future__ import annotations

from pathlib import Path

from batchrun.console.text import plural
from batchrun.job.lasting import CONTEXT, Lasting
from batchrun.job.paths import command


def failed_advice(failed: int, lasting: Lasting, job: Path, max_model_len: int | None) -> str:
    """What to run for a job's `failed` requests, `lasting` of which a retry cannot fix;
    `max_model_len`: the job's --max-model-len (None: it has none to raise)."""
    export, retry = command("export", job), command("retry-failed", job)
    them = _them(failed)
    if not lasting.count:
        return (
            f"{plural(failed, 'request')} failed: see {them} with `{export}` (errors.jsonl), or "
            f"run {them} again with `{retry}`."
        )
    said = [f"{plural(failed, 'request')} failed: see {them} with `{export}` (errors.jsonl)."]
    fixable = failed - lasting.count
    if fixable:
        said.append(f"{fixable:,} may succeed if run again: `{retry}`.")
    # Both kinds are fixed in the input the same way: the file changed, then those requests
    # run again (a forced resume takes the file; it does not run what already finished).
    rerun = f"then `{command('resume', job, '--force')}` takes the file and `{retry}` runs"
    if lasting.too_long:
        n = lasting.too_long
        longer = (
            f"`{retry} --max-model-len N` runs {_them(n)} with a longer context (N over "
            f"{max_model_len}, up to what the model takes), or shorten "
            if max_model_len is not None
            else "shorten "
        )
        said.append(
            f"{n:,} {'is' if n == 1 else 'are'} longer than the context (context_length_exceeded: "
            "the prompt and max_tokens over the model's context), which a retry cannot fix: "
            f"{longer}{_them(n)} (the prompt, or max_tokens) in the input file, {rerun} "
            f"{_them(n)}."
        )
    if lasting.refused:
        n = lasting.refused
        codes = ", ".join(code for code in lasting.by_code if code != CONTEXT)
        said.append(
            f"{n:,} {'was' if n == 1 else 'were'} refused by the engine for what "
            f"{'it holds' if n == 1 else 'they hold'} ({codes}: errors.jsonl says why), which a "
            f"retry cannot fix: fix {_them(n)} in the input file, {rerun} {_them(n)}."
        )
    return " ".join(said)


def lasting_note(lasting: Lasting) -> str:
    """` (a retry cannot fix 5: context_length_exceeded 5 needs a longer --max-model-len or a
    shorter input)`, after a failed count (the summary's and status'); empty when a retry may
    fix every failure."""
    if not lasting.count:
        return ""
    needs = []
    if lasting.too_long:
        needs.append(
            f"{CONTEXT} {lasting.too_long:,} needs a longer --max-model-len or a shorter input"
        )
    if lasting.refused:
        codes = ", ".join(f"{c} {n:,}" for c, n in lasting.by_code.items() if c != CONTEXT)
        needs.append(f"{codes} {'needs' if lasting.refused == 1 else 'need'} a change in the input")
    return f" (a retry cannot fix {lasting.count:,}: {'; '.join(needs)})"


def _them(n: int) -> str:
    return "it" if n == 1 else "them"
