"""The window's order measures a shared prefix exactly only where the order reads it
(planner._shared_prefixes): the same order as with every neighbour's prefix measured exactly."""

from __future__ import annotations

import random

import pytest

from batchrun.openai.records import Request
from batchrun.run import planner


def exact_prefixes(texts: list[str], by_text: list[int]) -> list[int]:
    """Every text's common prefix with the one before it in text order, all measured."""
    return [0] + [
        planner.common_prefix(texts[by_text[k - 1]], texts[by_text[k]])
        for k in range(1, len(by_text))
    ]


def windows(seed: int) -> list[list[Request]]:
    """Random windows of completions whose prompts share prefixes around MIN_SHARED."""
    rng = random.Random(seed)
    out = []
    for _ in range(400):
        bases = [
            "".join(rng.choice("ab") for _ in range(rng.choice([10, 250, 255, 256, 300, 600])))
            for _ in range(4)
        ]
        window = []
        for i in range(rng.randrange(2, 50)):
            base = rng.choice(bases)
            tail = "".join(rng.choice("abc") for _ in range(rng.randrange(0, 300)))
            body: dict[str, object] = {
                "model": "m",
                "prompt": base[: rng.randrange(len(base) + 1)] + tail,
            }
            body["max_tokens"] = rng.randrange(1, 50)
            window.append(Request(f"r{i}", i + 1, "/v1/completions", body))
        out.append(window)
    return out


def test_the_order_is_the_one_of_exact_prefixes(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = windows(28)
    got = [[r.custom_id for r in planner.order_window(w)] for w in cases]
    monkeypatch.setattr(planner, "_shared_prefixes", exact_prefixes)
    want = [[r.custom_id for r in planner.order_window(w)] for w in cases]
    assert got == want
    # The cases do reorder: groups are exercised, not only the file's order.
    assert sum(g != sorted(g, key=lambda c: int(c[1:])) for g in got) > 100


def test_a_prefix_is_exact_wherever_it_reaches_min_shared() -> None:
    texts = sorted(
        ["x" * 255 + "a", "x" * 255 + "b" + "y" * 300, "x" * 255 + "b" + "y" * 300 + "z"]
    )
    by_text = list(range(3))
    exact = exact_prefixes(texts, by_text)
    assert planner._shared_prefixes(texts, by_text) == [
        v if v >= planner.MIN_SHARED else 0 for v in exact
    ]
    assert exact[1] == 255 and exact[2] >= planner.MIN_SHARED  # one of each
