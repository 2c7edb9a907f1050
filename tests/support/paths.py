"""The checkout's folders, as the tests find them."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
SCRIPTS = ROOT / "scripts"
DATA = TESTS / "data"
FIXTURES = TESTS / "fixtures"
FAKES = TESTS / "support" / "fakes"
FAKE_NVML = FAKES / "nvml"
