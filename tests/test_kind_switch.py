"""serve's kind switch (batchrun/serve/kind_switch.py) on a fake clock: when the engine pool gives
way to a batch of another kind that comes first in the queue's order (docs/serve-kinds.md)."""

from __future__ import annotations

from batchrun.serve.kind_switch import KindSwitch

GEN, EMBED = "generate", "embed"


def test_the_pool_keeps_its_kind_while_no_other_kind_comes_first() -> None:
    switch = KindSwitch(switch_after=120.0)
    assert switch.keeps(GEN, None, has_work=False, now=0.0)
    assert switch.keeps(GEN, GEN, has_work=True, now=1_000.0)
    assert switch.waited(GEN, GEN, now=2_000.0) is None


def test_an_idle_pool_switches_at_once_for_another_kind() -> None:
    switch = KindSwitch(switch_after=120.0)
    assert not switch.keeps(GEN, EMBED, has_work=False, now=10.0)


def test_a_pool_with_work_keeps_its_kind_until_the_other_has_waited_switch_after() -> None:
    switch = KindSwitch(switch_after=120.0)
    assert switch.keeps(GEN, EMBED, has_work=True, now=10.0)  # the embed batch comes first now
    assert switch.waited(GEN, EMBED, now=70.0) == 60.0
    assert switch.keeps(GEN, EMBED, has_work=True, now=129.9)
    # The bound on starvation: past switch_after the pool gives way although it has work.
    assert not switch.keeps(GEN, EMBED, has_work=True, now=130.0)


def test_the_wait_starts_again_when_the_other_kind_stops_coming_first() -> None:
    switch = KindSwitch(switch_after=120.0)
    assert switch.keeps(GEN, EMBED, has_work=True, now=0.0)
    assert switch.keeps(GEN, GEN, has_work=True, now=100.0)  # a higher-priority generate batch
    assert switch.keeps(GEN, EMBED, has_work=True, now=150.0)
    assert switch.waited(GEN, EMBED, now=200.0) == 50.0
    assert not switch.keeps(GEN, EMBED, has_work=True, now=270.0)


def test_a_new_pool_starts_with_nobody_waiting() -> None:
    switch = KindSwitch(switch_after=120.0)
    switch.keeps(GEN, EMBED, has_work=True, now=0.0)
    switch.new_pool()  # the pool switched to embed; a generate batch now comes first
    assert switch.waited(EMBED, GEN, now=500.0) == 0.0
    assert switch.keeps(EMBED, GEN, has_work=True, now=619.0)
    assert not switch.keeps(EMBED, GEN, has_work=True, now=620.0)


def test_zero_switches_as_soon_as_another_kind_comes_first() -> None:
    switch = KindSwitch(switch_after=0.0)
    assert not switch.keeps(GEN, EMBED, has_work=True, now=5.0)
    assert switch.yields(GEN, lambda: EMBED, now=5.0)


def test_the_feed_yields_once_the_other_kind_has_waited_switch_after() -> None:
    switch = KindSwitch(switch_after=120.0, check_every=0.2)
    assert not switch.yields(GEN, lambda: EMBED, now=0.0)
    assert not switch.yields(GEN, lambda: EMBED, now=119.8)
    assert switch.yields(GEN, lambda: EMBED, now=120.0)
    assert not switch.yields(GEN, lambda: GEN, now=120.2)  # the embed batch no longer first


def test_the_feed_looks_at_the_queue_at_most_every_check_every() -> None:
    switch = KindSwitch(switch_after=0.0, check_every=0.2)
    looked: list[float] = []

    def first(kind: str, now: float) -> str:
        looked.append(now)
        return kind

    assert not switch.yields(GEN, lambda: first(GEN, 0.0), now=0.0)
    # Within check_every the answer stands, and the queue is not read again.
    assert not switch.yields(GEN, lambda: first(EMBED, 0.1), now=0.1)
    assert switch.yields(GEN, lambda: first(EMBED, 0.2), now=0.2)
    assert switch.yields(GEN, lambda: first(GEN, 0.3), now=0.3)
    assert looked == [0.0, 0.2]


def test_the_feed_and_the_pool_share_one_wait() -> None:
    """The pool's `keeps` and the feed's `yields` time the same waiting batch."""
    switch = KindSwitch(switch_after=120.0, check_every=0.2)
    assert switch.keeps(GEN, EMBED, has_work=True, now=0.0)
    assert switch.yields(GEN, lambda: EMBED, now=120.0)
    assert not switch.keeps(GEN, EMBED, has_work=True, now=120.0)


def test_models_switch_by_the_same_rule() -> None:
    """With several models a kind names its model: another model is another kind."""
    switch = KindSwitch(switch_after=120.0)
    assert not switch.keeps("generate:a", "generate:b", has_work=False, now=0.0)
    assert switch.keeps("generate:a", "generate:a", has_work=False, now=0.0)
