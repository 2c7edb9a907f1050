"""What every test process sets for the engines it starts (tests/conftest.py, isolated_cache)."""

from __future__ import annotations

# The KV cache of every engine the tests start (see isolated_cache).
TEST_KV_CACHE_BYTES = 1 << 30
