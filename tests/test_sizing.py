"""The batch-size search and the out-of-memory back-off (pure logic)."""

from __future__ import annotations

import pytest

from batchrun.config import EngineSettings
from batchrun.run.sizing import BatchSizeSearch, Probe, back_off, candidate_sizes
from batchrun.run.tuning import cache_key


def run_search(
    lo: int, hi: int, fits: int, tput: dict[int, float] | None = None
) -> tuple[int | None, list[int]]:
    """Simulate a machine where sizes above `fits` run out of memory."""
    search = BatchSizeSearch(lo, hi)
    tried = []
    while (size := search.next_size()) is not None:
        tried.append(size)
        assert len(tried) < 30, "the search must end"
        ok = size <= fits
        speed = (tput or {}).get(size, float(size)) if ok else 0.0
        search.report(Probe(size=size, ok=ok, requests=2 * size, seconds=1.0, tokens_per_s=speed))
    best = search.best()
    return (best.size if best else None), tried


def test_a_pooling_search_keeps_the_largest_size_that_runs() -> None:
    """No walk down for a pooling job: the top when it fits (one probe), else the largest size
    that ran, however the probes measured (a smaller window only leaves steps part empty)."""
    search = BatchSizeSearch(8, 256, walk_down=False)
    assert search.next_size() == 256
    search.report(Probe(size=256, ok=True, requests=512, seconds=1.0, tokens_per_s=700.0))
    assert search.next_size() is None
    best = search.best()
    assert best is not None and best.size == 256
    # Out of memory at the top: bisected down to what runs, and that one kept.
    search = BatchSizeSearch(8, 256, walk_down=False)
    speeds = {256: 0.0, 32: 900.0, 64: 500.0, 128: 0.0}
    tried = []
    while (size := search.next_size()) is not None:
        tried.append(size)
        ok = speeds.get(size, 0.0) > 0
        search.report(
            Probe(size=size, ok=ok, requests=size, seconds=1.0, tokens_per_s=speeds[size])
        )
    assert tried == [256, 32, 64, 128]
    best = search.best()
    assert best is not None and best.size == 64


def test_candidates_are_powers_of_two_within_bounds() -> None:
    assert candidate_sizes(8, 256) == [8, 16, 32, 64, 128, 256]
    assert candidate_sizes(3, 100) == [3, 4, 8, 16, 32, 64, 100]
    with pytest.raises(ValueError):
        candidate_sizes(0, 8)


def test_everything_fits_one_probe_at_the_top_then_one_below() -> None:
    chosen, tried = run_search(8, 256, fits=10_000)
    assert chosen == 256
    assert tried == [256, 128]  # 128 is slower, so the walk down stops at once


def test_binary_search_finds_the_largest_size_that_fits() -> None:
    chosen, tried = run_search(8, 256, fits=100)
    assert chosen == 64
    assert tried[0] == 256
    assert 128 in tried and 64 in tried
    assert len(tried) <= 5


def test_smaller_size_wins_when_it_is_faster_past_the_knee() -> None:
    chosen, _ = run_search(8, 256, fits=10_000, tput={256: 100.0, 128: 150.0, 64: 120.0})
    assert chosen == 128


def test_near_tie_prefers_the_larger_size() -> None:
    chosen, _ = run_search(8, 256, fits=10_000, tput={256: 100.0, 128: 102.0})
    assert chosen == 256


def test_nothing_fits_gives_no_size() -> None:
    chosen, tried = run_search(8, 256, fits=4)
    assert chosen is None
    assert tried[-1] == 8


def test_back_off_halves_until_one() -> None:
    assert back_off(64) == 32
    assert back_off(3) == 1
    assert back_off(1) is None


def test_the_size_cache_keeps_generation_and_embeddings_apart() -> None:
    """One model serves chat and embeddings jobs; a pooling model's best size is its own."""
    chat = EngineSettings(engine="vllm", model="/m", endpoint="/v1/chat/completions")
    completions = EngineSettings(engine="vllm", model="/m", endpoint="/v1/completions")
    embeddings = EngineSettings(engine="vllm", model="/m", endpoint="/v1/embeddings")
    assert cache_key(chat, "cpu") == cache_key(completions, "cpu")
    assert cache_key(embeddings, "cpu") != cache_key(chat, "cpu")
    assert cache_key(chat, "cpu") != cache_key(chat, "cuda:NVIDIA H100")
