"""Answers reused across jobs (`--cache-dir DIR`): a deterministic request's successful answer,
kept under a key of the model's identity, the endpoint and the canonical body.

Deterministic is the in-job deduplication's rule (run/dedup.py: temperature 0 with one choice,
or a fixed seed; pooling requests): a sampled request is never looked up nor stored. A hit is
journaled for its custom_id without reaching the engine (with `"cached": true`, which the
summary and status count); a miss runs, and its answer is stored only after it is journaled, so
every custom_id is still answered exactly once: a kill between the journal write and the cache
write leaves a journaled answer and no entry (a later job misses and runs it); a kill before
the journal write leaves nothing journaled, and resume looks the request up again.

Entries are single files, written atomically (a temp file renamed over the name), so jobs that
share a cache never see half an entry; one that cannot be read, is torn, was written by
another batchrun version or format, or whose body is no well-formed answer of its endpoint (an
entry edited by hand: `"choices": []`) is a miss, and the next answer replaces it.

Layout: `DIR/answers-v1/<2 hex>/<32 hex>.json`, each `{"batchrun", "key", "time", "status_code",
"body", "prompt_tokens", "completion_tokens"}`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from batchrun.config import EngineSettings
from batchrun.errors import BatchrunError
from batchrun.job.shards import ShardReader, stored_ref
from batchrun.openai.answers import answer_problem
from batchrun.openai.records import Outcome, Request
from batchrun.openai.vectors import fill_vectors
from batchrun.run.dedup import copy_outcome, dedup_key
from batchrun.version import __version__

FORMAT = "answers-v1"
# The settings that change an answer (the weights' identity is added by `model_identity`).
_IDENTITY_FIELDS = (
    "engine",
    "model",
    "revision",
    "model_commit",
    "tokenizer",
    "served_model_name",
    "model_name",
    "max_model_len",
    "dtype",
    "reasoning_parser",
    "lora_modules",
    "limit_mm_per_prompt",
)
_DECODE = msgspec.json.Decoder()


def model_identity(settings: EngineSettings) -> str:
    """What answers depend on besides the request: the engine options that change an answer and,
    for a local model, its files (name, size and modification time of each: a changed weight
    file is another model; hashing gigabytes of weights on every run would cost minutes)."""
    parts: dict[str, Any] = {name: getattr(settings, name) for name in _IDENTITY_FIELDS}
    if settings.model is not None:
        path = Path(settings.model)
        if path.exists():
            files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
            parts["files"] = [
                [str(p.relative_to(path) if p != path else p.name), st.st_size, st.st_mtime_ns]
                for p in files
                for st in [p.stat()]
            ]
    return json.dumps(parts, sort_keys=True, default=str)


@dataclass
class CacheCounts:
    """What one run did with the cache."""

    hits: int = 0
    misses: int = 0
    stored: int = 0


class AnswerCache:
    """A directory of answers shared by jobs (see the module's docstring)."""

    def __init__(self, root: Path, identity: str) -> None:
        self.root = root
        self.dir = root / FORMAT
        self._identity = hashlib.blake2b(identity.encode("utf-8"), digest_size=16).digest()
        self.counts = CacheCounts()

    @classmethod
    def open(cls, root: Path, settings: EngineSettings) -> AnswerCache:
        """The cache at `root` for a model (checked writable: see `check_cache_dir`)."""
        check_cache_dir(root)
        return cls(root, model_identity(settings))

    def key(self, request: Request) -> str | None:
        """The request's key; None when its answer may differ between runs (never cached)."""
        body_key = dedup_key(request)
        if body_key is None:
            return None
        return hashlib.blake2b(self._identity + body_key, digest_size=16).hexdigest()

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def lookup(self, requests: Sequence[Request]) -> tuple[list[Request], list[Outcome]]:
        """Split `requests` into those to run and the answers found for the others (each with
        its own custom_id and fresh response ids, marked `cached`)."""
        run: list[Request] = []
        hits: list[Outcome] = []
        for request in requests:
            key = self.key(request)
            entry = self._read(key, request.url) if key is not None else None
            if entry is None:
                run.append(request)
                if key is not None:
                    self.counts.misses += 1
                continue
            found = Outcome(
                custom_id="",
                ok=True,
                status_code=int(entry["status_code"]),
                body=entry["body"],
                prompt_tokens=int(entry["prompt_tokens"]),
                completion_tokens=int(entry["completion_tokens"]),
            )
            hit = copy_outcome(found, request)
            hit.extra = {"cached": True}
            hits.append(hit)
            self.counts.hits += 1
        return run, hits

    def _read(self, key: str, url: str) -> dict[str, Any] | None:
        """The entry of `key`; None (a miss) when absent, unreadable, torn, of another format, or
        when its body is no successful answer of endpoint `url` (openai/answers.py): a cached
        answer must be what the engine's would be, or the request runs."""
        try:
            data = self._path(key).read_bytes()
            entry = _DECODE.decode(data)
        except (OSError, msgspec.DecodeError):
            return None
        if (
            not isinstance(entry, dict)
            or entry.get("batchrun") != __version__
            or entry.get("key") != key
            or not isinstance(entry.get("body"), dict)
            or type(entry.get("status_code")) is not int
            or type(entry.get("prompt_tokens")) is not int
            or type(entry.get("completion_tokens")) is not int
            or not 200 <= entry["status_code"] < 300
            or answer_problem(url, entry["body"]) is not None
        ):
            return None
        return entry

    def store(
        self, pairs: Iterable[tuple[Outcome, Request]], shards: ShardReader | None = None
    ) -> None:
        """Keep the successful answers of deterministic requests (already journaled); an answer
        whose worker stored its body in a shard (job/shards.py) is read from `shards` (without
        them, it is not kept: a later job misses and runs it)."""
        for outcome, request in pairs:
            stored = outcome.stored
            if not outcome.ok or outcome.extra or (outcome.body is None and stored is None):
                continue  # failures are not answers; copies and hits are stored already
            key = self.key(request)
            if key is None:
                continue
            body, vectors = outcome.body, outcome.vectors
            if stored is not None:
                if shards is None:
                    continue
                text, split = shards.load(stored_ref(stored))
                body, vectors = msgspec.Raw(text), split or None
            if vectors is not None and isinstance(body, msgspec.Raw):
                # An entry holds its answer whole: the vectors back in as base64.
                body = msgspec.Raw(fill_vectors(bytes(body), vectors))
            data: Any = _DECODE.decode(body) if isinstance(body, msgspec.Raw) else body
            entry = {
                "batchrun": __version__,
                "key": key,
                "time": round(time.time(), 3),
                "status_code": outcome.status_code,
                "body": data,
                "prompt_tokens": int(outcome.prompt_tokens or 0),
                "completion_tokens": int(outcome.completion_tokens or 0),
            }
            try:
                payload = msgspec.json.encode(entry)
            except (TypeError, msgspec.EncodeError):
                continue
            if _write_atomic(self._path(key), payload):
                self.counts.stored += 1


def check_cache_dir(root: Path) -> None:
    """Create the cache at `root` and check it can be written: a BatchrunError naming
    --cache-dir otherwise (before any job is made)."""
    try:
        (root / FORMAT).mkdir(parents=True, exist_ok=True)
        probe = root / FORMAT / f".probe.{os.getpid()}.{secrets.token_hex(4)}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise BatchrunError(
            f"--cache-dir {root} cannot be used: {e.strerror or e}; give a directory you can write to"
        ) from None


def _write_atomic(path: Path, payload: bytes) -> bool:
    """Write `path` through a temp file renamed over it; False (nothing kept) on any error: a
    cache that cannot be written costs reuse, never the job."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        path.parent.mkdir(exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False


def check_existing_cache(root: Path) -> None:
    """Refuse (BatchrunError, exit 2) a `root` that is not an answer cache, before `stats` or
    `prune` look at it: a file, a path that is not there, or a directory no job has used as a
    cache (a typo would otherwise read as an empty cache: "0 answers")."""
    if root.is_dir() and (root / FORMAT).is_dir():
        return
    if not root.exists():
        why = "it does not exist"
    elif not root.is_dir():
        why = "it is a file, not a directory"
    else:
        why = f"it holds no {FORMAT}/ (a job given --cache-dir {root} makes it)"
    raise BatchrunError(f"--cache-dir {root} is not an answer cache: {why}", exit_code=2)


def entries(root: Path) -> Iterator[Path]:
    """Every entry file of the cache at `root` (its temp files left by a kill included)."""
    base = root / FORMAT
    if not base.is_dir():
        return
    for sub in sorted(base.iterdir()):
        if sub.is_dir():
            yield from sorted(p for p in sub.iterdir() if p.is_file())


def stats(root: Path) -> dict[str, Any]:
    """Entries, bytes and the oldest and newest entry's time (seconds since the epoch)."""
    count = size = 0
    oldest: float | None = None
    newest: float | None = None
    for p in entries(root):
        if p.name.startswith("."):
            continue
        st = p.stat()
        count += 1
        size += st.st_size
        oldest = st.st_mtime if oldest is None else min(oldest, st.st_mtime)
        newest = st.st_mtime if newest is None else max(newest, st.st_mtime)
    return {"dir": str(root), "entries": count, "bytes": size, "oldest": oldest, "newest": newest}


def prune(root: Path, older_than_s: float) -> tuple[int, int]:
    """Remove entries (and temp files) last written more than `older_than_s` ago; return the
    entries and bytes removed."""
    cutoff = time.time() - older_than_s
    count = size = 0
    for p in entries(root):
        with contextlib.suppress(OSError):
            st = p.stat()
            if st.st_mtime < cutoff:
                p.unlink()
                if not p.name.startswith("."):
                    count += 1
                    size += st.st_size
    return count, size
