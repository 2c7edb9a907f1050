"""vLLM's reasoning parser names remembered per installed build (engines/names_cache.py): a
command after the first reads them from the cache instead of importing vLLM; another build, or a
cache that cannot be read, lists them again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.lines import chat_line, write_jsonl
from support.paths import ROOT

from batchrun.engines.names_cache import FILE, build_key, cached_names

# The CLI in this process, then whether vLLM was imported, on stderr.
WRAP = (
    "import atexit, sys\n"
    "atexit.register(lambda: sys.stderr.write('\\nVLLM_IMPORTED=%s\\n' % ('vllm' in sys.modules)))\n"
    "from batchrun.cli import main\n"
    "sys.argv = ['batchrun', *sys.argv[1:]]\n"
    "main()\n"
)


class Loader:
    """A load that counts its calls."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.calls = 0

    def __call__(self) -> list[str]:
        self.calls += 1
        return list(self.names)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BATCHRUN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_names_are_listed_once_per_build(home: Path) -> None:
    load = Loader(["a", "b"])
    assert cached_names("parsers", "build-1", load) == ["a", "b"]
    assert cached_names("parsers", "build-1", load) == ["a", "b"]
    assert load.calls == 1
    assert json.loads((home / FILE).read_text())["parsers"] == {
        "key": "build-1",
        "names": ["a", "b"],
    }
    # Another build (an upgrade): listed again, and remembered for it.
    load.names = ["a", "b", "c"]
    assert cached_names("parsers", "build-2", load) == ["a", "b", "c"]
    assert cached_names("parsers", "build-2", load) == ["a", "b", "c"]
    assert load.calls == 2


def test_a_cache_that_cannot_be_read_or_written_is_only_slower(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home.mkdir(parents=True)
    (home / FILE).write_text("{not json")
    load = Loader(["x"])
    assert cached_names("parsers", "k", load) == ["x"]
    assert json.loads((home / FILE).read_text())["parsers"]["names"] == ["x"]
    # No package to key by: listed each time, nothing written.
    assert cached_names("other", None, load) == ["x"]
    assert load.calls == 2
    assert "other" not in json.loads((home / FILE).read_text())
    # A cache folder that cannot be made (a file stands in its way): the names all the same.
    monkeypatch.setenv("BATCHRUN_HOME", str(home / FILE / "below-a-file"))
    assert cached_names("parsers", "k", load) == ["x"]


def test_the_build_key_follows_the_package_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "fakepkg"
    (package / "reasoning").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "reasoning" / "__init__.py").write_text("NAMES = ['a']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = build_key("fakepkg", "reasoning", "fakepkg.plugins")
    assert first is not None and str(package) in first
    assert build_key("fakepkg", "reasoning", "fakepkg.plugins") == first
    # A parser module added (the folder's time changes) or the registry rewritten: another build.
    (package / "reasoning" / "new_parser.py").write_text("")
    os.utime(package / "reasoning", ns=(1, 1))
    second = build_key("fakepkg", "reasoning", "fakepkg.plugins")
    assert second not in (None, first)
    (package / "reasoning" / "__init__.py").write_text("NAMES = ['a', 'b']\n")
    assert build_key("fakepkg", "reasoning", "fakepkg.plugins") not in (None, first, second)
    # Not installed, or without the folder: no key (the names are listed each time).
    assert build_key("no_such_package_here", "reasoning", "x") is None
    assert build_key("fakepkg", "no_such_folder", "x") is None


@pytest.mark.slow
def test_a_bad_reasoning_parser_after_the_first_is_refused_without_importing_vllm(
    tmp_path: Path,
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    env = {**os.environ, "BATCHRUN_HOME": str(tmp_path / "home"), "COLUMNS": "1000"}

    def refuse() -> tuple[str, bool]:
        r = subprocess.run(
            [sys.executable, "-c", WRAP, "submit", str(src), "--job-dir", str(tmp_path / "job"),
             "--engine", "vllm", "--reasoning-parser", "qwen"],
            cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        assert r.returncode == 2, r.stderr[-2000:]
        said = next(x for x in r.stderr.splitlines() if "--reasoning-parser" in x)
        return said, "VLLM_IMPORTED=True" in r.stderr

    first, imported = refuse()
    assert imported  # nothing remembered yet: vLLM lists its parsers
    assert "names no reasoning parser of vllm's, got 'qwen'; it has " in first
    assert "qwen3" in first
    second, imported = refuse()
    assert not imported
    assert second == first
    assert not (tmp_path / "job").exists()
