"""``keyqueue lab fairness``: its simulations (exact, on a FakeClock) and its tables."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner, Result

from keyqueue.cli import keyqueue as keyqueue_cli
from keyqueue.lab._percentiles import percentile
from keyqueue.lab.fairness.run import FairnessConfig, FairnessResult, run_fairness

SMALL = FairnessConfig(
    relist=1_000,
    service=0.001,
    edit_every=0.05,
    aging=2.0,
    duration=10.0,
    failing=200,
    endpoint_duration=10.0,
)
SMALL_CLI = ["--relist", "1000", "--aging", "2", "--duration", "10", "--failing", "200"]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(keyqueue_cli, list(args), prog_name="keyqueue")


@pytest.fixture(scope="module")
def result() -> FairnessResult:
    return run_fairness(SMALL)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (
        50.0,
        99.0,
        100.0,
    )
    assert percentile([], 99) == 0.0


def test_edits_wait_behind_the_relist_as_plain_adds_and_only_for_the_key_in_hand_with_a_priority(
    result: FairnessResult,
) -> None:
    fifo, strict, aging = result.latency
    assert (fifo.mode, strict.mode, aging.mode) == (
        "FIFO (no priorities)",
        "strict priorities",
        "aging",
    )
    assert fifo.edits == strict.edits == 20  # one every 50 ms over the 1 s relist
    # Edit i (1..20) lands at i * 50 ms + 1/3 ms and is handed out after the relist
    # and the edits before it, at 1 s + (i - 1) ms: the median (nearest rank) is i = 11.
    assert fifo.edit_p50 == pytest.approx(1.0 + 10 * 0.001 - 11 * 0.05 - 0.001 / 3, abs=1e-9)
    assert fifo.relist_done == pytest.approx(0.999)
    # With a priority, an edit waits for the key in hand: 2/3 of a service time.
    for row in (strict, aging):
        assert row.edit_p99 == pytest.approx(0.002 / 3, abs=1e-12)
        assert row.edit_max == pytest.approx(0.002 / 3, abs=1e-12)
        assert row.relist_done == pytest.approx(0.999 + 20 * 0.001)


def test_strict_priorities_starve_the_relist_and_its_wait_grows_with_the_run(
    result: FairnessResult,
) -> None:
    rows = [row for row in result.stream if row.mode == "strict priorities"]
    assert [row.at for row in rows] == [5.0, 10.0]
    assert [row.relist_served for row in rows] == [0, 0]
    assert rows[0].relist_tail == pytest.approx(5.0, abs=0.002)
    assert rows[1].relist_tail == pytest.approx(10.0, abs=0.002)
    assert all(row.bound is None for row in rows)
    assert all(row.stream_p99 == pytest.approx(0.0005) for row in rows)


def test_aging_serves_the_whole_relist_within_the_printed_bound(result: FairnessResult) -> None:
    rows = [row for row in result.stream if row.mode == "aging"]
    assert [row.relist_served for row in rows] == [1_000, 1_000]
    # At t = (1 - 0) * 2 s the relist's credit catches up; it (1,000 keys) and the
    # key in hand are served then: the bound is 2 s + 1,001 ms.
    for row in rows:
        assert row.bound is not None
        assert row.bound == pytest.approx(2.0 + 1_001 * 0.001)
        assert row.relist_tail <= row.bound
        assert row.relist_tail == pytest.approx(3.0, abs=0.002)
    assert rows[0].relist_tail == rows[1].relist_tail  # bounded: the same however long
    assert result.aging_wait_part == 2.0


def test_one_bucket_makes_the_healthy_endpoint_wait_and_a_bucket_per_endpoint_does_not(
    result: FairnessResult,
) -> None:
    per_key, shared, per_endpoint = result.endpoints
    assert per_key.limiter == "per-key backoff only"
    assert [row.b_failures for row in (per_key, shared, per_endpoint)] == [9, 9, 9]
    # B's own backoff: its first failure, 5 ms.
    assert (per_key.b_delay_p50, per_key.b_delay_max) == (0.005, 0.005)
    assert (per_endpoint.b_delay_p50, per_endpoint.b_delay_max) == (0.005, 0.005)
    assert shared.b_delay_p50 > 1.0  # behind A's debt in the one bucket
    # Both buckets hold A to the same budget; per-key backoff alone does not.
    assert shared.calls_to_a == per_endpoint.calls_to_a
    assert per_key.calls_to_a > 5 * shared.calls_to_a
    assert per_key.a_calls_first_second == 200 * 8  # the first call and 7 retries < 1 s


def test_fair_by_namespace_makes_a_tenants_edit_wait_for_one_relist_key_not_the_relist(
    result: FairnessResult,
) -> None:
    plain, fair = result.tenants
    assert (plain.mode, fair.mode) == ("plain (FIFO)", "fair_by namespace")
    assert plain.edits == fair.edits == 20
    # Plainly, as (a)'s FIFO row: behind the relist.
    assert plain.edit_p99 == result.latency[0].edit_p99
    assert plain.bound is None
    # Fair: the key in hand (2/3 of a service) and at most one relist key.
    assert fair.bound == pytest.approx(0.002)
    assert fair.edit_max == pytest.approx(0.001 + 0.002 / 3, abs=1e-12)
    assert fair.edit_max <= fair.bound
    assert fair.relist_done == pytest.approx(0.999 + 20 * 0.001)


def test_fair_by_with_aging_serves_the_edits_in_turns_within_the_combined_bound(
    result: FairnessResult,
) -> None:
    """(d): the relist and team-b's edits at priority 0 under team-c's
    priority-1 stream at full capacity, aging 2 s. Aging alone serves the
    relist first, then the edits; with fair_by the edits take turns with
    the relist in the priority aging chose, all out by the printed bound."""
    aged, fair = result.combined
    assert (aged.mode, fair.mode) == ("aging", "aging + fair_by namespace")
    assert aged.edits == fair.edits == 20
    assert aged.bound is None
    assert aged.relist_done == pytest.approx(3.0)  # aging's (1 - 0) x 2 s, then 1,000 keys
    assert aged.edits_done > aged.relist_done  # behind all of it
    # (1 - 0) x 2 s, no stream key waiting then, the key in hand, 20 edits and 20 relist keys.
    assert fair.bound == pytest.approx(2.0 + (0 + 1 + 2 * 20) * 0.001)
    assert fair.edits_done <= fair.bound
    assert fair.edits_done < aged.relist_done
    assert fair.edit_max < aged.edit_max
    assert fair.relist_done == pytest.approx(aged.relist_done + 20 * 0.001)


def test_fairness_config_rejects_bad_values() -> None:
    for kwargs in ({"service": 0}, {"aging": float("nan")}, {"relist": 0}, {"failing": True}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            FairnessConfig(**kwargs)


def test_cli_plain_prints_the_three_tables_and_the_bound() -> None:
    out = invoke("lab", "fairness", *SMALL_CLI, "--plain")
    assert out.exit_code == 0, out.output
    text = out.output
    assert "(a) A relist of 1,000 keys (1ms each) at priority 0" in text
    assert "plainly (FIFO)" in text
    assert "at priority 1, aging 2s" in text
    assert "sustained priority-1 stream" in text
    assert "0 of 1,000" in text
    assert "1,000 of 1,000" in text
    assert "The bound: (P_max - p) x aging = (1 - 0) x 2s" in text
    assert "(1,001 keys x 1ms)" in text
    assert "(b) 200 keys keep failing against endpoint A" in text
    assert "per-key + a bucket per endpoint" in text
    assert "(c) One tenant's relist (1,000 keys, namespace default)" in text
    assert "fair_by=namespace" in text
    assert "(max 1.67ms, bound 2ms)" in text
    assert "(d) (c) beside a third tenant's priority-1 stream" in text
    assert "aging + fair_by=namespace" in text
    assert "\x1b[" not in text  # plain: no colour


def test_cli_json_is_the_result() -> None:
    out = invoke("lab", "fairness", *SMALL_CLI, "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["config"]["relist"] == 1_000
    assert [row["mode"] for row in data["latency"]] == [
        "FIFO (no priorities)",
        "strict priorities",
        "aging",
    ]
    assert len(data["stream"]) == 4
    assert data["endpoints"][2]["b_delay_p50"] == 0.005
    assert [row["mode"] for row in data["tenants"]] == ["plain (FIFO)", "fair_by namespace"]
    assert [row["mode"] for row in data["combined"]] == ["aging", "aging + fair_by namespace"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--service", "0"], "--service"),
        (["--aging", "nan"], "--aging"),
        (["--duration", "inf"], "--duration"),
        (["--aging", "100000"], "--aging"),
        (["--relist", "1000000", "--service", "10"], "--relist"),
        (["--failing", "0"], "--failing"),
    ],
)
def test_cli_bad_options_are_one_line_usage_errors(args: list[str], message: str) -> None:
    out = invoke("lab", "fairness", *args)
    assert out.exit_code == 2
    lines = out.output.strip().splitlines()
    assert len(lines) == 1, out.output
    assert message in lines[0]


def test_counts_of_one_take_the_singular() -> None:
    out = invoke("lab", "fairness", "--relist", "1", "--failing", "1", "--plain")
    assert out.exit_code == 0, out.output
    one_plural = r"\b1 (workers|keys|adds|events|reconciles|objects|retries|redeliveries|steps)\b"
    assert re.search(one_plural, out.output) is None, out.output
    assert "(a) A relist of 1 key (" in out.output
    assert "(b) 1 key keeps failing against endpoint A" in out.output
