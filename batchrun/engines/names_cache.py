"""Names an engine's package lists (vLLM's reasoning parsers, for --reasoning-parser's check),
remembered per installed build: listing them imports vLLM, about 4 s and half a gigabyte in the
parent before any job exists; a later command with the same build reads them from a file.

The build is told by what is on disk, never by importing the package: the package's folder, the
size and modification time of its `__init__.py` and of the folder the names come from (a
reinstall or upgrade rewrites them, and adding or removing a file changes a folder's time), and
the package's plugin entry points (a plugin may register names of its own).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

from batchrun.cache_home import cache_root
from batchrun.errors import BatchrunError
from batchrun.job.files import atomic_write

FILE = "engine_names.json"


def build_key(package: str, folder: str, plugin_group: str) -> str | None:
    """What tells this build of `package` apart, read from disk; None if it is not installed."""
    try:
        spec = importlib.util.find_spec(package)  # finds, does not import, a top-level package
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    parts: list[object] = [str(root)]
    for path in (root / "__init__.py", root / folder, root / folder / "__init__.py"):
        try:
            st = path.stat()
        except OSError:
            return None
        parts.append([st.st_size, st.st_mtime_ns])
    plugins = importlib.metadata.entry_points(group=plugin_group)
    parts.append(sorted(f"{e.name}={e.value}" for e in plugins))
    return json.dumps(parts, separators=(",", ":"))


def cached_names(kind: str, key: str | None, load: Callable[[], list[str]]) -> list[str]:
    """The names of `kind` for the build `key`: from the cache when it has them for that build,
    else `load()`ed and remembered (a cache that cannot be read or written is only slower)."""
    if key is None:
        return load()
    path = cache_root() / FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    entry = data.get(kind)
    if isinstance(entry, dict) and entry.get("key") == key and isinstance(entry.get("names"), list):
        return [str(name) for name in entry["names"]]
    names = load()
    data[kind] = {"key": key, "names": names}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: f.write(json.dumps(data, indent=1).encode()))
    except (OSError, BatchrunError):
        pass
    return names
