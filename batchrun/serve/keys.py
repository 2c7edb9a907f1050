"""The server's API keys: each key is a tenant, and a key is kept only as a salted hash.

A key given with `--api-key` (repeatable) or in `--api-keys-file` (one `NAME KEY` or `KEY` a
line) is stored in the root's settings (serve/settings.py) as `{tenant, salt, digest}`: the
digest is HMAC-SHA256 of the key under a random salt of its own, so the root never holds a key
in clear and two roots never hold the same digest. A request's bearer key is checked against each
digest in constant time. A tenant is the file's NAME, or, for a key given without one, `key-`
and 8 random hex digits, kept while the key is (a key given again finds its digest, and so its
tenant); the logs and /metrics name tenants so, never by the key.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec

from batchrun.errors import BatchrunError

# Where a key came from: its own option, or the keys file (re-read on SIGHUP).
FROM_OPTION, FROM_FILE = "option", "file"
# A tenant's name in the keys file: what logs and /metrics may show.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# The names given to keys that came without one.
_UNNAMED = re.compile(r"key-[0-9a-f]{8}")


class KeyEntry(msgspec.Struct, kw_only=True):
    """One key as the root keeps it: its tenant, its salt and the salted digest (hex)."""

    tenant: str
    salt: str
    digest: str
    source: str = FROM_OPTION


def _digest(key: str | bytes, salt: str) -> str:
    raw = key if isinstance(key, bytes) else key.encode()
    return hmac.new(bytes.fromhex(salt), raw, hashlib.sha256).hexdigest()


def matches(entry: KeyEntry, key: str | bytes) -> bool:
    """Whether `key` is the key `entry` was made from (constant time)."""
    return hmac.compare_digest(_digest(key, entry.salt), entry.digest)


def entries_for(
    keys: Sequence[tuple[str | None, str]], source: str, known: Iterable[KeyEntry]
) -> list[KeyEntry]:
    """The entries of `keys` ((NAME or None, KEY) pairs): a key `known` already holds keeps its
    entry (its salt and, when it has no name, its tenant); a new one gets a fresh salt."""
    known = list(known)
    out: list[KeyEntry] = []
    for name, key in keys:
        old = next((e for e in known if matches(e, key)), None)
        if old is not None and (name is None or old.tenant == name):
            out.append(KeyEntry(tenant=old.tenant, salt=old.salt, digest=old.digest, source=source))
            continue
        salt = secrets.token_hex(16)
        tenant = name if name is not None else f"key-{secrets.token_hex(4)}"
        out.append(KeyEntry(tenant=tenant, salt=salt, digest=_digest(key, salt), source=source))
    return out


def check_distinct(entries: Sequence[KeyEntry], keys: Sequence[str]) -> None:
    """Refuse a key given twice, or a tenant named twice (one line, naming no key)."""
    if len(set(keys)) != len(keys):
        raise BatchrunError(
            "--api-key, --api-keys-file: the same key is given twice (a key is one tenant)",
            exit_code=2,
        )
    tenants = [e.tenant for e in entries]
    for tenant in tenants:
        if tenants.count(tenant) > 1:
            raise BatchrunError(f"--api-keys-file names the tenant {tenant!r} twice", exit_code=2)


def read_keys_file(path: Path) -> list[tuple[str | None, str]]:
    """The keys of a keys file: one `NAME KEY` or `KEY` a line; blank lines and lines starting
    with # are skipped. BatchrunError (one line, naming the line, never its key) when it cannot
    be read or a line is neither."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise BatchrunError(f"--api-keys-file {path}: cannot read it: {reason}") from None
    keys: list[tuple[str | None, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        if len(parts) > 2:
            raise BatchrunError(
                f"--api-keys-file {path}, line {number}: has {len(parts)} words; a line is "
                "NAME KEY or KEY"
            )
        name = parts[0] if len(parts) == 2 else None
        if name is not None and (not _NAME.fullmatch(name) or _UNNAMED.fullmatch(name)):
            raise BatchrunError(
                f"--api-keys-file {path}, line {number}: the tenant name {name!r} is not one "
                "(letters, digits, . _ -, at most 64, not key- and 8 hex digits)"
            )
        keys.append((name, parts[-1]))
    return keys


class Keys:
    """The keys a server takes now (replaced whole on SIGHUP), and whose each is."""

    def __init__(self, entries: Sequence[KeyEntry], *, required: bool | None = None) -> None:
        self._entries = list(entries)
        # Decided once: a server started with keys (or a keys file) never opens up, even when
        # a SIGHUP finds its keys file empty (then nobody gets in).
        self._required = bool(entries) if required is None else required
        self._lock = threading.Lock()

    @property
    def entries(self) -> list[KeyEntry]:
        """The entries now."""
        with self._lock:
            return list(self._entries)

    def replace(self, entries: Sequence[KeyEntry]) -> None:
        """Take these entries from now on."""
        with self._lock:
            self._entries = list(entries)

    def open(self) -> bool:
        """Whether the server takes requests without a key (it was started with none)."""
        return not self._required

    def tenant(self, key: str | bytes) -> str | None:
        """The tenant whose key `key` is (as sent: bytes); None when it is nobody's. Every entry
        is checked, so the time taken does not say which one matched."""
        found = None
        for entry in self.entries:
            if matches(entry, key) and found is None:
                found = entry.tenant
        return found
