"""``keyqueue.testing.check_history`` and the fenced stores, on histories written by hand.

Each rule is shown broken once and kept once; the fences refuse a lower
token (and, strict, an equal one), in memory and on a real server.
"""

from __future__ import annotations

import redis

from keyqueue.testing import (
    AddRecord,
    HoldRecord,
    MemoryFence,
    ValkeyFence,
    check_history,
    local_valkey,
)


def hold(key: str, token: int, start: float, end: float, **more: object) -> HoldRecord:
    return HoldRecord(key, token, f"h{token}", start, end, **more)  # type: ignore[arg-type]


def test_a_clean_history_breaks_no_rule() -> None:
    found = check_history(
        [hold("a", 1, 0, 1), hold("b", 2, 0.5, 1.5), hold("a", 3, 1.2, 2)],
        [AddRecord("a", 1.1), AddRecord("b", 0.1)],
    )
    assert found.ok, found.violations
    assert found.summary().startswith("3 holds, 2 acknowledged adds: 0 tokens reissued")


def test_a_token_handed_out_twice_is_reissued_even_on_another_key() -> None:
    found = check_history([hold("a", 1, 0, 1), hold("b", 1, 2, 3)])
    assert found.tokens_reissued == 1
    assert found.by_rule == {"token-reused": 1}
    assert check_history([hold("a", 1, 0, 1), hold("b", 1, 2, 3)], tokens="key").ok


def test_tokens_of_one_key_must_increase_in_the_order_its_holds_started() -> None:
    found = check_history([hold("a", 5, 0, 1), hold("a", 3, 2, 3)])
    assert found.token_regressions == 1
    assert not found.overlaps


def test_overlapping_valid_holds_count_and_a_stale_win_is_named() -> None:
    found = check_history([hold("a", 5, 0, 2), hold("a", 3, 1, 3)])
    assert (found.overlaps, found.stale_wins) == (1, 1)


def test_a_hold_refused_by_the_store_or_told_in_time_is_not_valid() -> None:
    refused = check_history([hold("a", 1, 0, 2, accepted=False), hold("a", 2, 1, 3)])
    told = check_history([hold("a", 1, 0, 2, lost_at=0.9, outcome="lost"), hold("a", 2, 1, 3)])
    assert refused.ok
    assert told.ok


def test_an_acknowledged_add_needs_an_accepted_hold_that_started_after_it() -> None:
    found = check_history(
        [hold("a", 1, 0, 1), hold("b", 2, 3, 4, accepted=False)],
        [AddRecord("a", 0.5), AddRecord("b", 2), AddRecord("c", 0)],
    )
    assert found.adds_lost == 3


def test_keys_left_held_are_violations() -> None:
    assert check_history([], left_held=["a", "a", "b"]).left_held == 2


def test_the_fences_refuse_a_lower_token_and_strictly_an_equal_one() -> None:
    with local_valkey() as url:
        client = redis.Redis.from_url(url)
        for strict in (False, True):
            for fence in (
                MemoryFence(strict=strict),
                ValkeyFence(client, f"f{strict}", strict=strict),
            ):
                assert fence.write("k", 5, "v5")
                assert not fence.write("k", 4, "v4")
                assert fence.write("k", 5, "again") is not strict
                assert fence.write("k", 6, "v6")
                assert fence.write("other", 1, "x")
        client.close()
