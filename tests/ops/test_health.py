"""The health verdict ``keyqueue top`` and the dashboard share.

Scripted counters on a fake clock: each test writes the snapshots a queue
would give, one a second of fake time, and feeds them to ``Health`` (and,
where it says so, to the dashboard's per-queue state and to ``top``'s
rendering), so every number the verdict reads is known. The tests against a
real server (an overdue key, a lease run out, a reset, the header) are in
ops/test_dashboard.py and ops/test_commands.py.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import random
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console

from keyqueue import DelayedKey, FailingKey, HeldKey, Snapshot, WaitingKey
from keyqueue._console.format import Mode, Output, due, duration
from keyqueue.dashboard.monitor import _Queue
from keyqueue.ops import render
from keyqueue.ops.health import (
    MIN_SPAN,
    WINDOW,
    Health,
    Probe,
    Reading,
    Verdict,
)
from keyqueue.redis import RedisStats
from keyqueue.testing import FakeClock

ZERO = {f.name: 0 for f in dataclasses.fields(RedisStats)}


def stats(**values: Any) -> RedisStats:
    """A queue's counters: zero but for ``values``."""
    fields: dict[str, Any] = {**ZERO, "shutting_down": False, "waiting_by_priority": {}}
    fields.update(queue_wait_seconds=0.0, work_seconds=0.0, oldest_wait_seconds=0.0)
    fields.update(values)
    if "waiting_by_priority" not in values:
        fields["waiting_by_priority"] = {0: fields["depth"]} if fields["depth"] else {}
    return RedisStats(**fields)


def snapshot(
    at: float,
    s: RedisStats,
    *,
    delayed: tuple[DelayedKey[str], ...] = (),
    processing: tuple[HeldKey[str], ...] = (),
    waiting: tuple[WaitingKey[str], ...] = (),
    failing: tuple[FailingKey[str], ...] = (),
) -> Snapshot[str]:
    return Snapshot(s, waiting, processing, delayed, failing, at, 100, len(failing))


class Script:
    """A queue's counters, advanced one fake second at a time."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.c: dict[str, Any] = {
            "adds": 0,
            "enqueued": 0,
            "coalesced": 0,
            "redeliveries": 0,
            "gets": 0,
            "dones": 0,
            "retries": 0,
            "rate_limited": 0,
            "work_seconds": 0.0,
            "queue_wait_seconds": 0.0,
        }

    def second(
        self,
        *,
        arrive: int,
        done: int,
        failed: int = 0,
        coalesced: int = 0,
        depth: int,
        processing: int = 2,
        delayed: int = 0,
        oldest: float = 0.1,
    ) -> Snapshot[str]:
        self.clock.step(1.0)
        c = self.c
        c["adds"] += arrive + coalesced
        c["enqueued"] += arrive
        c["coalesced"] += coalesced
        c["gets"] += done  # a failed key is done too, and comes back through the limiter
        c["dones"] += done
        c["retries"] += failed
        c["rate_limited"] += failed
        c["work_seconds"] += done * 0.02
        return snapshot(
            self.clock.now(),
            stats(
                **c,
                depth=depth,
                max_depth=max(depth, 15),
                processing=processing,
                delayed=delayed,
                oldest_wait_seconds=oldest,
            ),
        )


def run(snaps: Iterator[Snapshot[str]] | list[Snapshot[str]], health: Health) -> list[Verdict]:
    return [health.update(Reading.of(snap)) for snap in snaps]


def steady_noisy(clock: FakeClock, seconds: int, seed: int = 7) -> list[Snapshot[str]]:
    """The issue's queue: 2 workers, about 96 distinct keys/s in and out, the two
    rates crossing by a hair each second, depth 5 to 15, keys waiting about 100 ms,
    a few failures a second retried well within the bucket."""
    rng = random.Random(seed)
    script = Script(clock)
    snaps = []
    for i in range(seconds):
        arrive = 96 + (1 if i % 2 else 0)  # 96.4 against 96.3, in turn
        done = 96 + (0 if i % 2 else 1)
        snaps.append(
            script.second(
                arrive=arrive,
                done=done,
                failed=rng.randint(3, 6),
                coalesced=rng.randint(0, 20),
                depth=rng.randint(5, 15),
                delayed=rng.randint(3, 8),
                oldest=rng.uniform(0.05, 0.15),
            )
        )
    return snaps


def test_a_steady_noisy_queue_never_flips() -> None:
    clock = FakeClock(1_800_000_000.0)
    snaps = steady_noisy(clock, 30)
    verdicts = run(snaps, Health())
    crossings = sum(
        (a.rates.arrive > a.rates.dones) != (b.rates.arrive > b.rates.dones)
        for a, b in itertools.pairwise(verdicts)
        if a.rates and b.rates
    )
    assert crossings >= 20  # the per-second rates do cross, again and again
    states = [v.state for v in verdicts]
    ready = int(MIN_SPAN)  # the reading 10 s after the first: a trend may be read
    assert set(states[:ready]) == {"starting"}, states
    assert set(states[ready:]) == {"keeping-up"}, [v.text for v in verdicts]
    assert all(len(v.findings) == 1 for v in verdicts)
    assert verdicts[-1].text.startswith("Keeping up: ")
    assert "over the last 29s" in verdicts[-1].text
    # And for longer than one window, with other noise: still never a flip.
    more = [v.state for v in run(steady_noisy(FakeClock(0.0), 200, seed=11), Health())]
    assert set(more[ready:]) == {"keeping-up"}


def test_a_growing_backlog_says_falling_behind_and_stays_so() -> None:
    clock = FakeClock(1_800_000_000.0)
    rng = random.Random(3)
    script = Script(clock)
    snaps = [
        script.second(
            arrive=100,
            done=96,
            depth=10 + 4 * i + rng.randint(-3, 3),
            oldest=0.1 + 0.04 * i,
        )
        for i in range(30)
    ]
    verdicts = run(snaps, Health())
    states = [v.state for v in verdicts]
    assert "behind" not in states[: int(MIN_SPAN)]  # no trend before 10 s of readings
    first = states.index("behind")
    assert first <= 15
    assert set(states[first:]) == {"behind"}  # once behind, no flip back
    text = verdicts[-1].text
    assert text.startswith("Falling behind: waiting went from ")
    assert "100 distinct keys/s arrive and 96/s are reconciled" in text


def test_the_oldest_wait_growing_alone_is_falling_behind() -> None:
    script = Script(FakeClock(0.0))
    snaps = [script.second(arrive=50, done=50, depth=8, oldest=1.0 + i) for i in range(30)]
    assert run(snaps, Health())[-1].state == "behind"


def test_a_backlog_that_clears_leaves_behind_with_hysteresis() -> None:
    script = Script(FakeClock(0.0))
    health = Health()
    up = run([script.second(arrive=100, done=90, depth=10 * i) for i in range(20)], health)
    assert up[-1].state == "behind"
    flat = run([script.second(arrive=90, done=90, depth=190) for _ in range(int(WINDOW))], health)
    states = [v.state for v in flat]
    cleared = states.index("keeping-up")
    assert set(states[cleared:]) == {"keeping-up"}


def test_retry_debt_is_the_health_line_and_tops_reading() -> None:
    """The issue's run: failures (15/s) outran the shared bucket (10/s), delayed
    keys grew 40 -> 57 -> 69 -> 83 and the backoff reached 68 s."""
    clock = FakeClock(1_800_000_000.0)
    script = Script(clock)
    health = Health()
    verdict = None
    for i in range(31):
        snap = script.second(
            arrive=80, done=80, failed=15, depth=10, delayed=40 + round(43 * i / 30)
        )
        probed = Probe(bucket_tokens=-120.0 - i, bucket_last=clock.now(), last_due=clock.now() + 68)
        verdict = health.update(Reading.of(snap, probed))
    assert verdict is not None
    assert verdict.states == ["retry-debt"]
    text = verdict.text
    assert text.startswith("Retry debt: delayed keys went from ")
    assert "15 failures/s come back through the limiter" in text
    assert "the shared retry bucket is 150 tokens in debt" in text
    assert "the longest backoff is 1m8s" in text
    line = render.plain_line(snap, verdict)
    assert " longest_backoff=1m8s health=retry-debt" in line
    frame = _frame_text(snap, verdict)
    assert text in frame


def test_the_bucket_in_debt_alone_is_retry_debt_and_a_full_bucket_is_not() -> None:
    clock = FakeClock(100.0)
    script = Script(clock)
    snap = script.second(arrive=5, done=5, failed=2, depth=1, delayed=9)
    debt = Health().update(Reading.of(snap, Probe(-3.0, clock.now() - 1, clock.now() + 4)))
    assert debt.state == "retry-debt"
    assert "9 keys delayed" in debt.text
    full = Health().update(Reading.of(snap, Probe(95.0, clock.now() - 1, clock.now() + 4)))
    assert full.states == ["starting"]
    assert full.longest_backoff == 4.0


def _frame_text(snap: Snapshot[str], verdict: Verdict) -> str:
    out = Output(Mode.PLAIN)
    out.console = Console(record=True, width=400, color_system=None)
    out.console.print(render.frame("q", "127.0.0.1:6379/0", snap, verdict, out, 5))
    return out.console.export_text()


# -- what a snapshot says at once ---------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "words"),
    [
        ("overdue", "Overdue: 1 delayed key is past due (the first by 4m18s)"),
        ("expired-leases", "Leases run out: 1 held key past its lease (the first by 30s)"),
        ("no-workers", "No worker is taking keys: 12 keys wait, the oldest for 4m18s"),
    ],
)
def test_overdue_expired_and_no_worker_each_have_their_own_reading(state: str, words: str) -> None:
    at = 1_800_000_000.0
    if state == "overdue":  # no workers, one key overdue by about 4 minutes
        snap = snapshot(
            at, stats(delayed=1, adds=1, retries=1), delayed=(DelayedKey("k", -258.0, 0),)
        )
    elif state == "expired-leases":
        snap = snapshot(
            at,
            stats(processing=1, gets=1, adds=1, enqueued=1),
            processing=(HeldKey("k", "gone:1", 7, 60.0, -30.0),),
        )
    else:
        snap = snapshot(at, stats(depth=12, adds=12, enqueued=12, oldest_wait_seconds=258.0))
    health = Health()
    verdicts = [
        health.update(Reading.of(dataclasses.replace(snap, taken_at=at + i))) for i in range(3)
    ]
    for verdict in verdicts:
        assert verdict.state == state, verdict.text
        assert verdict.text.startswith(words), verdict.text
        assert "Idle" not in verdict.text


def test_a_delayed_key_just_due_or_a_lease_just_run_out_is_not_yet_trouble() -> None:
    snap = snapshot(
        10.0,
        stats(delayed=1, processing=1, gets=1),
        delayed=(DelayedKey("k", -0.2, 0),),
        processing=(HeldKey("h", "w", 1, 3.0, -0.3),),
    )
    assert Health().update(Reading.of(snap)).states == ["starting"]


def test_an_empty_quiet_queue_is_idle() -> None:
    health = Health()
    for t in (1.0, 2.0):
        verdict = health.update(Reading.of(snapshot(t, stats(adds=3, dones=3, gets=3))))
    assert verdict.state == "idle"
    assert (
        verdict.text
        == "Idle: nothing waits, is held or delayed, and nothing arrived in the last 1s."
    )


# -- one formatter --------------------------------------------------------------------------


def test_every_duration_comes_from_one_formatter() -> None:
    assert due(-258.0) == "overdue 4m18s"
    assert due(4.5) == "in 4.5s"
    assert due(None) == "-"
    assert duration(-258.0) == "-4m18s"  # never -258,000,000µs
    assert render.cells(DelayedKey("k", -258.0, 0)) == ("overdue 4m18s", "0")
    assert render.cells(HeldKey("k", "w", 3, 1.5, -2.0)) == ("w", "3", "1.5s", "overdue 2s")
    assert render.cells(FailingKey("k", 2, None)) == ("2", "not delayed")
    assert render.cells(WaitingKey("k", 1, 0.0021)) == ("1", "2.1ms")


# -- resets -----------------------------------------------------------------------------------


def test_a_counter_that_goes_down_is_a_reset_and_rates_restart_from_it() -> None:
    """A server restart or a delete and re-create: counters start again from 0."""
    clock = FakeClock(1_000.0)
    script = Script(clock)
    health = Health()
    before = run([script.second(arrive=500, done=500, depth=3) for _ in range(5)], health)
    assert before[-1].rates is not None
    assert before[-1].rates.adds == 500
    again = Script(clock)  # a new queue of the same name, on the same clock
    after = run([again.second(arrive=20, done=20, depth=1) for _ in range(5)], health)
    assert after[0].rates is None  # no rate across the reset
    assert after[0].reset_at == clock.now() - 4
    assert after[0].window is None  # the window starts again from the reset
    assert [v.rates.adds for v in after[1:] if v.rates] == [20, 20, 20, 20]
    assert all(v.state == "starting" for v in after)  # the window starts again


def test_top_plain_and_the_dashboard_show_no_negative_rate_after_a_reset() -> None:
    clock = FakeClock(1_000.0)
    health, queue = Health(), _Queue("q", "redis://127.0.0.1:1/0")
    script = Script(clock)
    snaps = [script.second(arrive=500, done=500, depth=3) for _ in range(4)]
    script = Script(clock)
    snaps += [script.second(arrive=20, done=20, depth=1) for _ in range(4)]
    lines = []
    for snap in snaps:
        lines.append(render.plain_line(snap, health.update(Reading.of(snap))))
        queue.update(snap)
    fields = [dict(pair.split("=", 1) for pair in line.split()[1:]) for line in lines]
    assert [f["adds/s"] for f in fields] == ["-", "500", "500", "500", "-", "20", "20", "20"]
    points = queue.state(history=True)["history"]
    assert [p[2] for p in points] == [500, 500, 500, None, 20, 20, 20]  # no point below 0
    assert queue.latest is not None
    assert queue.latest["reset_at"] == snaps[4].taken_at


# -- top and the dashboard say the same thing ------------------------------------------------


def test_top_and_the_dashboard_say_the_same_thing_about_the_same_state() -> None:
    clock = FakeClock(1_800_000_000.0)
    script = Script(clock)
    health, queue = Health(), _Queue("q", "redis://127.0.0.1:1/0")
    said = set()
    for i in range(40):
        snap = script.second(
            arrive=100, done=90, failed=12, depth=10 + 5 * i, delayed=20 + 2 * i, oldest=0.1 * i
        )
        snap = dataclasses.replace(
            snap,
            delayed=(DelayedKey("late", -3.5, 0), DelayedKey("soon", 2.0, 1)),
            processing=(HeldKey("h", "worker-1", 4, 1.0, 20.0),),
            failing=(FailingKey("late", 3, -3.5),),
            failing_keys=1,
        )
        probed = Probe(-40.0, clock.now(), clock.now() + 75)
        verdict = health.update(Reading.of(snap, probed))
        queue.update(snap, probed)
        page = queue.state(history=False)
        assert page["health"] == verdict.as_dict()  # one verdict, computed once
        frame = _frame_text(snap, verdict)
        for finding in verdict.findings:
            assert finding.text in frame
        for kind in ("delayed", "processing", "failing"):
            for row, typed in zip(page["now"][kind], getattr(snap, kind), strict=True):
                assert row["cells"] == list(render.cells(typed))
                assert " ".join(row["cells"]) in " ".join(frame.split())
        assert page["now"]["shown"]["longest_backoff"] == "1m15s"
        said |= set(verdict.states)
    assert {"overdue", "behind", "retry-debt"} <= said


def test_keys_held_with_none_done_and_others_waiting_is_stalled_after_half_a_window() -> None:
    script = Script(FakeClock(0.0))
    stuck = run([script.second(arrive=0, done=0, depth=5, oldest=1.0) for _ in range(40)], Health())
    states = [v.state for v in stuck]
    assert "stalled" not in states[:30]
    assert set(states[30:]) == {"stalled"}
    assert stuck[-1].text.startswith("Stalled: 2 keys held, none done in the last 39s, and 5 keys")
    slow = Script(FakeClock(0.0))  # long handlers, nothing waiting behind them: no alarm
    calm = run([slow.second(arrive=0, done=0, depth=0, oldest=0.0) for _ in range(40)], Health())
    assert "stalled" not in {v.state for v in calm}


# -- top on a small terminal --------------------------------------------------------------


def test_top_at_80x24_shows_every_list_on_the_screen() -> None:
    # Before: 5 rows of each list and the health lines made a frame taller than
    # 24 lines; rich cropped it to a "..." above the Delayed and Failing lists.
    at = 1_800_000_000.0
    snap = snapshot(
        at,
        stats(depth=40, processing=8, delayed=30, adds=100, gets=60, dones=52),
        waiting=tuple(WaitingKey(f"w{i}", 0, 1.0 + i) for i in range(5)),
        processing=tuple(HeldKey(f"h{i}", "web-1:42", i, 2.0, 28.0) for i in range(5)),
        delayed=tuple(DelayedKey(f"d{i}", 5.0 + i, 0) for i in range(5)),
        failing=tuple(FailingKey(f"f{i}", 9 - i, 5.0 + i) for i in range(5)),
    )
    verdict = Health().update(Reading.of(snap))
    for height in (24, 16):
        out = Output(Mode.RICH)
        out.console = Console(
            record=True, width=80, height=height, color_system=None, file=io.StringIO()
        )
        out.console.print(render.frame("q", "127.0.0.1:6379/0", snap, verdict, out, 5, height))
        lines = out.console.export_text().splitlines()
        assert len(lines) <= height, "\n".join(lines)
        text = "\n".join(lines)
        for what in ("Waiting", "Processing", "Delayed", "Failing"):
            assert f"{what}: " in text, text
        assert "Ctrl-C to quit" in lines[-1]
    # a tall terminal shows the five rows of each
    out = Output(Mode.RICH)
    out.console = Console(record=True, width=80, height=100, color_system=None, file=io.StringIO())
    out.console.print(render.frame("q", "127.0.0.1:6379/0", snap, verdict, out, 5, 100))
    text = out.console.export_text()
    assert "Failing: 5" in text
    assert "f4" in text
