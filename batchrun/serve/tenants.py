"""Who sees what on a server with keys: each key is a tenant (serve/keys.py), and every file and
batch belongs to the tenant that made it (a batch's output and error files to its batch's).

A tenant sees what it made, and what was made before the server had keys (everyone shared it
then already); another tenant's file or batch is, to it, a file or batch that does not exist:
the same 404 (or 400 for a batch's input file) as an unknown id, in lists as in cursors. A server
without keys, and the server's own threads, ask as `EVERYONE` and see everything.
"""

from __future__ import annotations

# The tenant of a request to a server without keys, and of the server's own reads: no filter.
EVERYONE: str | None = None


def visible(owner: str | None, tenant: str | None) -> bool:
    """Whether `tenant` sees a file or batch that `owner` made (None: made before keys)."""
    return tenant is None or owner is None or owner == tenant
