"""The lab (``keyqueue lab ...``): each subcommand in-process on short settings.

Nothing here asserts on timing or speed: the firehose's rates and percentiles
vary with the machine, so only its bookkeeping is checked; the slowmo's proof
key is scripted with handshakes, so its trace is the same at any speed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest
from click.testing import CliRunner, Result

from keyqueue import ItemExponentialFailureRateLimiter, default_controller_rate_limiter
from keyqueue.lab import render
from keyqueue.lab.backoff import run_backoff
from keyqueue.lab.cli import keyqueue as keyqueue_cli
from keyqueue.lab.firehose import KEEP_UP, FirehoseConfig, percentiles, run_firehose
from keyqueue.lab.model import KEYS_NOTE, POISSON_WARNING, run_model
from keyqueue.lab.slowmo import PROOF_KEY, SlowmoConfig, run_slowmo
from keyqueue.testing import FakeClock

FAST_SLOWMO = ["--speed", "100"]
SHORT_FIREHOSE = [
    "--rate",
    "4000",
    "--keys",
    "5",
    "--duration",
    "0.3",
    "--workers",
    "2",
    "--reconcile",
    "1",
    "--failure-rate",
    "0.1",
    "--seed",
    "7",
]

TRACE_LINE = re.compile(r"^\s*(\d+)\s+[\d.]+s \[([A-Z-]+?)(?:-(\d+))?\] key=(\S+) ?(.*)$")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(keyqueue_cli, list(args), prog_name="keyqueue")


def run_python(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=60, check=False, **kwargs
    )


def parse_trace(output: str) -> list[tuple[int, str, str, str]]:
    """(line number, tag, key, rest) for every trace line printed."""
    lines = []
    for text in output.splitlines():
        m = TRACE_LINE.match(text)
        if m:
            number, tag, _worker, key, rest = m.groups()
            lines.append((int(number), tag, key, rest))
    return lines


# -- packaging: the stub, the extra, python -m ------------------------------------


def test_import_keyqueue_imports_neither_the_lab_nor_its_libraries() -> None:
    code = (
        "import sys, keyqueue, keyqueue.cli\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('click', 'rich')"
        " or m.startswith('keyqueue.lab'))\n"
        "assert not bad, bad\n"
    )
    proc = run_python("-c", code)
    assert proc.returncode == 0, proc.stderr


def test_command_without_the_lab_extra_prints_the_install_line() -> None:
    code = (
        "import sys\n"
        "sys.modules['rich'] = None  # as if keyqueue[lab] were not installed\n"
        "from keyqueue.cli import main\n"
        "main(['lab', 'model'])\n"
    )
    proc = run_python("-c", code)
    assert proc.returncode == 1
    assert "pip install 'keyqueue[lab]'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_python_dash_m_keyqueue_runs_the_command() -> None:
    proc = run_python("-m", "keyqueue", "lab", "model", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["arrival"] == 4.0


def test_bad_option_from_the_real_command_is_one_line_and_exit_2() -> None:
    proc = run_python("-m", "keyqueue", "lab", "firehose", "--rate", "-5")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "--rate" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- help and errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["lab"],
        ["lab", "slowmo"],
        ["lab", "firehose"],
        ["lab", "backoff"],
        ["lab", "model"],
    ],
)
def test_help_explains_every_command(args: list[str]) -> None:
    result = invoke(*args, "--help")
    assert result.exit_code == 0
    assert "Usage: keyqueue" in result.output
    if args and args[-1] != "lab":
        assert "--json" in result.output
        assert "--plain" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["lab", "firehose", "--rate", "-5"],
        ["lab", "firehose", "--rate", "0"],
        ["lab", "firehose", "--keys", "0"],
        ["lab", "firehose", "--failure-rate", "1.5"],
        ["lab", "firehose", "--duration", "-1"],
        ["lab", "firehose", "--bogus"],
        ["lab", "slowmo", "--speed", "0"],
        ["lab", "slowmo", "--rate", "-1"],
        ["lab", "backoff", "--herd", "0"],
        ["lab", "backoff", "--base", "5", "--cap", "0.001"],
        ["lab", "model", "--service", "0"],
        ["lab", "model", "--arrival", "-1"],
        ["lab", "model", "--backlog", "lots"],
        ["lab", "nosuch"],
        ["nosuch"],
    ],
)
def test_bad_options_get_one_line_and_exit_status_2(args: list[str]) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("keyqueue")
    assert "error:" in lines[0]
    assert "Traceback" not in result.stderr


# -- slowmo ------------------------------------------------------------------------


def test_slowmo_prints_the_trio_in_order_for_one_key() -> None:
    result = invoke("lab", "slowmo", *FAST_SLOWMO, "--plain")
    assert result.exit_code == 0, result.output
    trace = parse_trace(result.output)
    web = [(n, tag, rest) for n, tag, key, rest in trace if key == PROOF_KEY]
    tags = [tag if tag != "WORKER" else f"WORKER {rest.split()[0]}" for _, tag, rest in web]
    assert tags == [
        "ENQUEUE",
        "WORKER Get",
        "REQUEUE-WHILE-PROCESSING",
        "DEDUP",
        "DEDUP",
        "WORKER Done",
        "REDELIVERY",
        "WORKER Get",
        "WORKER Done",
    ]
    # Line numbers count every printed trace line, in order.
    assert [n for n, *_ in trace] == list(range(1, len(trace) + 1))
    # The summary points at those very lines.
    mark, dedup1, dedup2, redelivery, get = (web[i][0] for i in (2, 3, 4, 6, 7))
    summary = result.output.split("The proof")[1]
    assert re.search(rf"line {mark}\s+\[REQUEUE-WHILE-PROCESSING\]", summary)
    assert re.search(rf"lines {dedup1}, {dedup2}\s+\[DEDUP\]", summary)
    assert re.search(rf"line {redelivery}\s+\[REDELIVERY\]", summary)
    assert re.search(rf"line {get}\s+\[WORKER-\d+\] Get seq=", summary)


def test_slowmo_result_holds_the_proof_and_consistent_stats() -> None:
    result = run_slowmo(SlowmoConfig(speed=200))
    assert not result.interrupted
    proof = result.proof
    assert proof is not None
    assert proof.key == PROOF_KEY
    assert proof.mark.n < proof.dedups[0].n < proof.dedups[1].n < proof.redelivery.n < proof.get.n
    assert proof.held_seq is not None
    assert proof.get.seq is not None
    assert proof.get.seq > proof.held_seq
    s = result.stats
    # The counters match the trace: one line per transition the queue reported,
    # one WORKER Get and one Done line per key handed out.
    tags = [f"{x.tag} {x.action}" if x.tag == "WORKER" else x.tag for x in result.lines]
    assert (s.enqueued, s.coalesced, s.marked_while_processing, s.redeliveries) == (
        tags.count("ENQUEUE"),
        tags.count("DEDUP"),
        tags.count("REQUEUE-WHILE-PROCESSING"),
        tags.count("REDELIVERY"),
    )
    assert (s.gets, s.dones) == (tags.count("WORKER Get"), tags.count("WORKER Done"))
    assert (s.depth, s.processing, s.delayed) == (0, 0, 0)  # drained
    assert result.failures == 2  # default/db fails twice, then succeeds
    ratelimits = [line.text for line in result.lines if line.tag == "RATELIMIT"]
    assert [re.findall(r"attempt=(\d+)", text) for text in ratelimits] == [["1"], ["2"]]
    assert s.adds == result.events + len(ratelimits)  # each backoff came due once


def test_slowmo_json_parses() -> None:
    result = invoke("lab", "slowmo", *FAST_SLOWMO, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["proof"]["key"] == PROOF_KEY
    assert len(data["proof"]["dedup_lines"]) == 2
    texts = {line["n"]: line["text"] for line in data["lines"]}
    assert texts[data["proof"]["redelivery_line"]].startswith("[REDELIVERY] key=default/web")


def test_slowmo_interrupted_keeps_the_lines_so_far() -> None:
    def stop_after_three(done: int, total: int) -> None:
        if done == 3:
            raise KeyboardInterrupt

    result = run_slowmo(SlowmoConfig(speed=200), on_step=stop_after_three)
    assert result.interrupted
    assert result.events == 3
    assert result.lines
    assert result.proof is None
    summary = "\n".join(str(r) for r in render.slowmo_summary(result))
    assert "interrupted" in summary


# -- firehose ----------------------------------------------------------------------


def test_firehose_stats_add_up() -> None:
    config = FirehoseConfig(
        rate=5000, keys=5, duration=0.5, workers=2, reconcile=0.001, failure_rate=0.1, seed=3
    )
    result = run_firehose(config)
    s = result.stats
    assert result.events > 0
    # Every event is an accepted add; on top, each rate-limited retry comes due at most once.
    assert result.events <= s.adds <= result.events + s.rate_limited
    assert s.rate_limited <= result.failures  # a retry only follows a failed reconcile
    assert s.processing == 0
    assert s.depth == 0
    assert result.absorbed == 100.0 * s.coalesced / s.adds
    assert result.ticks
    for tick in result.ticks:
        assert tick.adds >= tick.events  # sampled after the producer's count
        assert tick.absorbed == (100.0 * tick.coalesced / tick.adds if tick.adds else 0.0)
    for field in ("events", "adds", "enqueued", "coalesced", "processed"):
        totals = [getattr(tick, field) for tick in result.ticks]
        assert totals == sorted(totals), f"{field} went down between ticks"
    assert result.ticks[-1].events == result.events
    # The lab's own GET and DONE samples, one per key handed out and finished.
    assert result.reconcile.count == s.dones
    assert result.queue_wait.count == s.gets


def test_firehose_plain_prints_stats_lines_and_a_summary() -> None:
    result = invoke("lab", "firehose", *SHORT_FIREHOSE, "--plain")
    assert result.exit_code == 0, result.output
    stats = [line for line in result.output.splitlines() if line.startswith("[STATS] ")]
    assert stats
    for line in stats:
        for field in ("adds=", "coalesced=", "marked=", "processed=", "rate-limited=", "depth="):
            assert field in line
        assert "absorbed=" in line
        assert "wait p50/p95/p99=" in line
        assert "reconcile p50/p95/p99=" in line
    summary = result.output.split("Summary")[1]
    assert "achieved" in summary
    assert re.search(r"events, \d+\.\d% absorbed, .* reconciles a second\.", summary)


def test_firehose_json_parses_and_adds_up() -> None:
    result = invoke("lab", "firehose", *SHORT_FIREHOSE, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    s = data["stats"]
    assert data["events"] <= s["adds"] <= data["events"] + s["rate_limited"]
    assert (s["depth"], s["processing"]) == (0, 0)  # drained
    assert data["config"]["rate"] == 4000
    assert data["kept_up"] is (data["achieved_rate"] >= KEEP_UP * data["config"]["rate"])


def test_firehose_interrupted_prints_the_summary_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt(tick: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(render, "firehose_stats_line", interrupt)
    result = invoke("lab", "firehose", *SHORT_FIREHOSE, "--duration", "30", "--plain")
    assert result.exit_code == 130
    assert "Summary (interrupted)" in result.output
    assert "absorbed" in result.output


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT delivery")
def test_ctrl_c_on_the_real_command_prints_the_summary() -> None:
    command = ["lab", "firehose", "--plain", "--duration", "60", "--rate", "2000"]
    # A shell running the tests in the background may have SIGINT ignored; the
    # child installs Python's own handler, as a foreground `keyqueue` would have.
    bootstrap = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from keyqueue.cli import main; main(sys.argv[1:])"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", bootstrap, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    # A child that dies early, or never prints a [STATS] line, fails the test
    # instead of hanging it: readline returns "" at end of file, and the
    # watchdog kills a child that stays silent.
    watchdog = threading.Timer(30, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and not line.startswith("[STATS]"):
            line = proc.stdout.readline()
        if not line:
            _, err = proc.communicate(timeout=30)
            pytest.fail(
                f"no [STATS] line before the command ended (status {proc.returncode}):\n{err}"
            )
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert "Summary (interrupted)" in out
    assert "Traceback" not in err


def test_percentiles_are_nearest_rank() -> None:
    p = percentiles([float(x) for x in range(1, 101)])
    assert (p.count, p.p50, p.p95, p.p99) == (100, 50.0, 95.0, 99.0)
    assert percentiles([]).p50 is None


@pytest.mark.parametrize(
    ("x", "words"),
    [
        (500_000, "half a million"),
        (487_000, "about half a million"),
        (1000, "a thousand"),
        (987, "about a thousand"),
        (150_000, "a hundred and fifty thousand"),
        (20, "twenty"),
        (0, "none"),
    ],
)
def test_summary_numbers_read_as_words(x: float, words: str) -> None:
    assert render.roughly(x) == words


# -- backoff -----------------------------------------------------------------------


def test_backoff_table_is_the_limiters_own_values() -> None:
    result = run_backoff(0.005, 1000.0, herd_keys=10)
    limiter = ItemExponentialFailureRateLimiter(0.005, 1000.0)
    assert [row.delay for row in result.rows] == [limiter.when("k") for _ in result.rows]
    assert result.cap_attempt == 19  # 5 ms * 2**18 > 1000 s
    assert [row.attempt for row in result.rows] == list(range(1, 22))  # two rows past the cap
    assert result.rows[-1].total == pytest.approx(sum(row.delay for row in result.rows))


def test_backoff_herd_is_smoothed_to_the_buckets_rate() -> None:
    keys = 500
    result = run_backoff(0.005, 1000.0, herd_keys=keys).herd
    clock = FakeClock()
    limiter = default_controller_rate_limiter(clock)
    delays = [limiter.when(f"k{i}") for i in range(keys)]
    expected = [0] * (int(max(delays) - 1e-9) + 1)
    for delay in delays:
        expected[max(0, int(delay - 1e-9))] += 1  # released in (s, s+1]
    assert list(result.readds_per_second) == expected
    assert result.readds_per_second[0] == 110  # burst of 100 plus 10 in the first second
    assert set(result.readds_per_second[1:]) == {10}
    assert result.last_readd == max(delays) == 40.0
    assert result.within_burst == 100


def test_backoff_cli_plain_and_json() -> None:
    result = invoke("lab", "backoff", "--base", "100", "--cap", "1", "--herd", "150", "--plain")
    assert result.exit_code == 0, result.output
    assert re.search(r"^\s*5\s+1s\s+1\s+.*← cap", result.output, re.MULTILINE)
    assert "Attempt 5 is the first to hit the cap" in result.output
    result = invoke("lab", "backoff", "--attempts", "3", "--herd", "150", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [row["delay"] for row in data["rows"]] == [0.005, 0.01, 0.02]
    assert sum(data["herd"]["readds_per_second"]) == 150


# -- model -------------------------------------------------------------------------


def test_model_overloaded_backlog_grows_as_4_plus_t() -> None:
    result = run_model(4, 3, 4, steps=10)
    assert [step.backlog for step in result.steps] == [4 + t for t in range(11)]
    assert result.clears_at is None
    assert result.mm1 is None
    assert result.utilisation == pytest.approx(4 / 3)


def test_model_underloaded_backlog_clears_at_t_4() -> None:
    result = run_model(2, 3, 4)
    assert [step.backlog for step in result.steps[:6]] == [4, 3, 2, 1, 0, 0]
    assert result.clears_at == 4
    assert result.mm1 is not None
    assert result.mm1.rho == pytest.approx(2 / 3)
    assert result.mm1.mean_in_system == pytest.approx(2.0)  # rho / (1 - rho)
    assert result.mm1.mean_time_in_system == pytest.approx(1.0)  # 1 / (mu - lambda)
    assert result.warnings == (POISSON_WARNING, KEYS_NOTE)


def test_model_cli_prints_the_estimates_and_the_warning() -> None:
    result = invoke("lab", "model", "--arrival", "2", "--service", "3", "--backlog", "4")
    assert result.exit_code == 0, result.output
    assert "clears at t = 4" in result.output
    assert "M/M/1" in result.output
    assert "Poisson" in result.output
    assert "distinct keys" in result.output
    result = invoke("lab", "model", "--lambda", "4", "--mu", "3", "--json")
    data = json.loads(result.stdout)
    assert [step["backlog"] for step in data["steps"][:5]] == [4, 5, 6, 7, 8]
    assert data["mm1"] is None
