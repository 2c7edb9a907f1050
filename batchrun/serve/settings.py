"""What a serve root remembers of how it was started (ROOT/serve.json), so that
`batchrun serve --root R` alone brings back the same service.

The root keeps the engine options as they were given (engine, models, adapters, batch options),
the address (host and port), the upload limit, --ray, --cache-dir and --gpu-hour-cost, the keys
file's path, and each API key as a salted hash (serve/keys.py), never in clear. A start takes the root's settings
and puts over them the options given now. An option given with another value than the root's is
applied from now on and said in the log, except one that changes which model answers a line
(the engine, a model name's model, an adapter name's path, the revision, tokenizer or dtype)
while the root has unfinished batches: a batch is never answered by two models, so that start
is refused, in one line naming both values (exit 2).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import msgspec

from batchrun.config import EngineSettings, GivenOptions
from batchrun.errors import BatchrunError
from batchrun.job.files import write_json_atomic
from batchrun.run.options import RunOptions
from batchrun.serve.batches import RECORD_NAME, TERMINAL
from batchrun.serve.keys import (
    FROM_FILE,
    FROM_OPTION,
    KeyEntry,
    check_distinct,
    entries_for,
    matches,
    read_keys_file,
)

SETTINGS_NAME = "serve.json"
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8000
DEFAULT_MAX_FILE_BYTES = 200 * 1000 * 1000  # OpenAI's limit for a batch input file
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_ENGINE_FIELDS = frozenset(f.name for f in fields(GivenOptions))


class Saved(msgspec.Struct, kw_only=True):
    """The settings a root remembers (None or empty: not given, the default)."""

    options: dict[str, Any] = msgspec.field(default_factory=dict)
    host: str | None = None
    port: int | None = None
    max_file_bytes: int | None = None
    ray: str | None = None
    cache_dir: str | None = None
    keys_file: str | None = None
    keys: list[KeyEntry] = msgspec.field(default_factory=list)
    gpu_hour_cost: float | None = None


@dataclass
class Given:
    """The options this start was given (None: not given)."""

    options: GivenOptions
    host: str | None = None
    port: int | None = None
    max_file_bytes: int | None = None
    ray: str | None = None
    cache_dir: Path | None = None
    api_keys: list[str] | None = None
    api_keys_file: Path | None = None
    gpu_hour_cost: float | None = None


@dataclass
class Settings:
    """What this start serves with: the root's settings with the options given put over them."""

    options: RunOptions
    host: str
    port: int
    max_file_bytes: int
    keys: list[KeyEntry]
    keys_file: Path | None
    saved: Saved
    # The log's lines for each option given with another value than the root's.
    changes: list[str] = field(default_factory=list)
    # USD per GPU-hour the batches' runs are priced at (job/cost.py); None: not priced.
    gpu_hour_cost: float | None = None


def load(root: Path) -> Saved | None:
    """The root's settings; None for a root that has none (new, or from before they were kept)."""
    path = root / SETTINGS_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise BatchrunError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        return msgspec.json.decode(data, type=Saved)
    except msgspec.DecodeError as e:
        raise BatchrunError(
            f"{path} is not a serve root's settings ({e}); move it away to start afresh"
        ) from None


def save(root: Path, saved: Saved) -> None:
    """Write the root's settings atomically."""
    write_json_atomic(root / SETTINGS_NAME, msgspec.to_builtins(saved))


def resolve(root: Path, given: Given) -> Settings:
    """The settings this start serves with; BatchrunError (exit 2) for a change that would
    answer an unfinished batch with another model, or a key given twice."""
    loaded = load(root)
    saved = loaded or Saved()
    old_options = {k: v for k, v in saved.options.items() if k in _ENGINE_FIELDS}
    new_given = given.options.given()
    if "model" in new_given or "models" in new_given:  # one option, --model, however given
        old_options.pop("model", None)
        old_options.pop("models", None)
    merged = {**old_options, **new_given}
    ray = given.ray if given.ray is not None else saved.ray
    options = RunOptions.from_given(GivenOptions(**merged), progress=False, ray=ray)
    changes: list[str] = []
    for name, value in new_given.items():
        before = saved.options.get(name)
        if name in ("model", "models"):
            before = saved.options.get("models") or saved.options.get("model")
        if loaded is not None and before != value:
            changes.append(f"{_flag(name)} {_shown(value)} (this root had {_shown(before)})")
    if loaded is not None:
        _refuse_another_model(root, saved, merged, ray)
    cache_dir = given.cache_dir if given.cache_dir is not None else saved.cache_dir
    if cache_dir is not None:
        options.cache_dir = Path(cache_dir).absolute()
    serve_given = {
        "host": given.host,
        "port": given.port,
        "max_file_bytes": given.max_file_bytes,
        "ray": given.ray,
        "cache_dir": str(given.cache_dir.absolute()) if given.cache_dir is not None else None,
        "gpu_hour_cost": given.gpu_hour_cost,
    }
    for name, value in serve_given.items():
        before = getattr(saved, name)
        if value is not None and before is not None and before != value:
            changes.append(f"{_flag(name)} {value} (this root had {before})")
    host = given.host or saved.host or DEFAULT_HOST
    port = given.port or saved.port or DEFAULT_PORT
    max_file_bytes = given.max_file_bytes or saved.max_file_bytes or DEFAULT_MAX_FILE_BYTES
    cost = given.gpu_hour_cost if given.gpu_hour_cost is not None else saved.gpu_hour_cost
    keys_file = given.api_keys_file or (Path(saved.keys_file) if saved.keys_file else None)
    keys = _keys(saved, given, keys_file, changes if loaded is not None else [])
    new_saved = Saved(
        options=merged,
        host=host,
        port=port,
        max_file_bytes=max_file_bytes,
        ray=ray,
        cache_dir=str(options.cache_dir) if options.cache_dir is not None else None,
        keys_file=str(keys_file.absolute()) if keys_file is not None else None,
        keys=keys,
        gpu_hour_cost=cost,
    )
    return Settings(options, host, port, max_file_bytes, keys, keys_file, new_saved, changes, cost)


def reread_keys(root: Path, saved: Saved, keys_file: Path) -> list[KeyEntry]:
    """The keys after reading the keys file again (on SIGHUP): the root's keys given with
    --api-key, and the file's as it is now (a key known before keeps its tenant), remembered in
    the root. BatchrunError (the keys stay as they were) for a file that cannot be read, or that
    holds a key twice or a key given with --api-key."""
    pairs = read_keys_file(keys_file)
    from_option = [e for e in saved.keys if e.source == FROM_OPTION]
    if any(matches(e, key) for e in from_option for _, key in pairs):
        raise BatchrunError(
            f"--api-keys-file {keys_file} holds a key given with --api-key (a key is one tenant)"
        )
    from_file = entries_for(pairs, FROM_FILE, saved.keys)
    entries = from_option + from_file
    check_distinct(entries, [key for _, key in pairs])
    saved.keys = entries
    save(root, saved)
    return entries


def _keys(saved: Saved, given: Given, keys_file: Path | None, changes: list[str]) -> list[KeyEntry]:
    """The keys this start takes: the ones given now, else the root's (the keys file read again
    whenever there is one: it is where its keys live)."""
    known = saved.keys
    had = [e for e in known if e.source == FROM_OPTION]
    if given.api_keys is not None:
        from_option = entries_for([(None, k) for k in given.api_keys], FROM_OPTION, known)
        if {e.digest for e in from_option} != {e.digest for e in had}:
            before = f"{len(had)} other{'s' if len(had) != 1 else ''}" if had else "none"
            changes.append(f"--api-key: {len(from_option)} given (this root had {before})")
    else:
        from_option = had
    from_file: list[KeyEntry] = []
    clear = list(given.api_keys or [])
    if keys_file is not None:
        pairs = read_keys_file(keys_file)
        if any(matches(e, key) for e in from_option for _, key in pairs):
            raise BatchrunError(
                f"--api-keys-file {keys_file} holds a key given with --api-key (a key is one "
                "tenant)",
                exit_code=2,
            )
        clear += [k for _, k in pairs]
        from_file = entries_for(pairs, FROM_FILE, known)
    entries = from_option + from_file
    check_distinct(entries, clear)
    return entries


def _refuse_another_model(
    root: Path, saved: Saved, merged: dict[str, Any], ray: str | None
) -> None:
    """BatchrunError (exit 2) when the options would answer a line of an unfinished batch with another
    model than the one it was accepted on (the root's)."""
    before = RunOptions.from_given(
        GivenOptions(**{k: v for k, v in saved.options.items() if k in _ENGINE_FIELDS}),
        progress=False,
        ray=ray,
    ).settings
    after = RunOptions.from_given(GivenOptions(**merged), progress=False, ray=ray).settings
    name = _other_model(before, after)
    if name is None:
        return
    left = unfinished(root)
    if not left:
        return
    if name == "model":
        old = saved.options.get("models") or saved.options.get("model")
        new = merged.get("models") or merged.get("model")
    else:
        old, new = saved.options.get(name), merged.get(name)
    batches = f"{left} unfinished batch{'es were' if left > 1 else ' was'}"
    flag = _flag(name)
    then = f"with {flag} {_shown(old)}" if old is not None else f"without {flag}"
    raise BatchrunError(
        f"{flag} {_shown(new)} differs from this root's {flag} {_shown(old)}, which its "
        f"{batches} accepted on (a batch is never answered by two models): start it {then} "
        "(or with --root alone) to finish them, or use another --root",
        exit_code=2,
    )


def _other_model(before: EngineSettings, after: EngineSettings) -> str | None:
    """The option (a GivenOptions field) by which `after` answers some line with another model
    than `before` would; None when every line keeps its model (or ends unanswered: a name the
    server no longer runs is `model_not_found`, serve/unserved_models.py)."""
    for name in ("engine", "revision", "tokenizer", "dtype"):
        if getattr(before, name) != getattr(after, name):
            return name
    old = {m["name"]: m["model"] for m in before.models}
    new = {m["name"]: m["model"] for m in after.models}
    if old and new:  # names keep their models; names come and go
        if any(new[n] != old[n] for n in new.keys() & old.keys()):
            return "model"
    elif old:  # one model now: it answers the lines naming it, so it must be one of them
        if after.model not in old.values():
            return "model"
    elif new:  # one model before answered every name: each name now must be that model
        if any(m != before.model for m in new.values()):
            return "model"
    elif before.model != after.model:
        return "model"
    old_adapters = {a["name"]: (a["path"], a.get("base_model_name")) for a in before.lora_modules}
    new_adapters = {a["name"]: (a["path"], a.get("base_model_name")) for a in after.lora_modules}
    if any(new_adapters[n] != old_adapters[n] for n in new_adapters.keys() & old_adapters.keys()):
        return "lora_modules"
    return None


def unfinished(root: Path) -> int:
    """How many batches of the root have not ended."""
    count = 0
    for path in (root / "batches").glob(f"*/{RECORD_NAME}"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            if json.loads(path.read_text(encoding="utf-8"))["batch"]["status"] not in TERMINAL:
                count += 1
    return count


def _flag(name: str) -> str:
    """The option's flag: `--batch-size` for batch_size, `--model` for models."""
    return "--model" if name == "models" else "--" + name.replace("_", "-")


def _shown(value: Any) -> str:
    """An option's value as the log and a refusal show it."""
    if value is None:
        return "(the default)"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) if value else "(none)"
    return str(value)
