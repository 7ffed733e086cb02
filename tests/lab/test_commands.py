"""The lab (``keyqueue lab ...``): each subcommand in-process on short settings.

Nothing here asserts on timing or speed: the firehose's rates and percentiles
vary with the machine, so only its bookkeeping is checked; the slowmo's proof
key is scripted with handshakes, so its trace is the same at any speed.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import click
import pytest
import redis
from click.testing import CliRunner, Result
from rich.console import Console

from keyqueue import (
    ItemExponentialFailureRateLimiter,
    Stats,
    WorkQueue,
    default_controller_rate_limiter,
)
from keyqueue._console import format as _format
from keyqueue._console.format import counted
from keyqueue.cli import keyqueue as keyqueue_cli
from keyqueue.lab._percentiles import Percentiles, percentiles
from keyqueue.lab.backoff.run import run_backoff
from keyqueue.lab.firehose import render as firehose_render
from keyqueue.lab.firehose.common import (
    KEEP_UP,
    FirehoseConfig,
    FirehoseResult,
    FirehoseTick,
    Producer,
    firehose_result,
    key_draws,
    key_name,
)
from keyqueue.lab.firehose.run import run_firehose
from keyqueue.lab.model.run import KEYS_NOTE, POISSON_WARNING, run_model
from keyqueue.lab.pipeline import render as pipeline_render
from keyqueue.lab.pipeline.run import PipelineConfig, PipelineResult
from keyqueue.lab.simulated import SimulatedFailure, quiet_simulated_give_ups
from keyqueue.lab.slowmo import render as slowmo_render
from keyqueue.lab.slowmo.run import PROOF_KEY, SlowmoConfig, SlowmoResult, TraceLine, run_slowmo
from keyqueue.redis import RedisWorkQueue
from keyqueue.testing import FakeClock
from tests.support.foreground import FOREGROUND, first_line

ROOT = Path(__file__).resolve().parents[2]
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
    "--reconcile-ms",
    "1",
    "--failure-rate",
    "0.1",
    "--seed",
    "7",
]

TRACE_LINE = re.compile(r"^\s*([\d,]+)\s+[\d.,]+s \[([A-Z-]+?)(?:-(\d+))?\] key=(\S+) ?(.*)$")


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
            lines.append((int(number.replace(",", "")), tag, key, rest))
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


def test_ctrl_c_while_the_lab_loads_is_exit_130_without_a_traceback() -> None:
    code = (
        "import builtins\n"
        "from keyqueue.cli import main\n"
        "real = builtins.__import__\n"
        "def loading(name, *args, **kwargs):\n"
        "    if name == '_console.commands':  # the stub's lazy import: Ctrl-C lands there\n"
        "        raise KeyboardInterrupt\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = loading\n"
        "main(['lab', 'model'])\n"
    )
    proc = run_python("-c", code)
    assert proc.returncode == 130
    assert proc.stderr == "keyqueue: interrupted\n"
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("loads", "run"),
    [
        ("keyqueue.cli", "from _keyqueue_launch import main; main()"),  # the console script
        ("_console.commands", "from keyqueue.cli import main; main(['lab', 'model'])"),
    ],
    ids=["entry point", "cli"],
)
def test_ctrl_c_while_a_class_is_made_is_exit_130_without_a_traceback(loads: str, run: str) -> None:
    # Python 3.11 wraps what a __set_name__ raises (a dataclass field's, rich's
    # classes' as they load) in a RuntimeError: the Ctrl-C is its cause.
    code = (
        "import builtins\n"
        "class Field:\n"
        "    def __set_name__(self, owner, name):  # Ctrl-C lands here\n"
        "        raise KeyboardInterrupt\n"
        "real = builtins.__import__\n"
        "def loading(name, *args, **kwargs):\n"
        f"    if name == {loads!r}:\n"
        "        class Made:\n"
        "            field = Field()\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = loading\n"
        f"{run}\n"
    )
    proc = run_python("-c", code)
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, "keyqueue: interrupted\n", "")


def test_ctrl_c_while_the_command_line_is_read_is_exit_130_not_aborted() -> None:
    code = (
        "import click\n"
        "from keyqueue.cli import main\n"
        "def parse_args(self, ctx, args):  # the top group reading its arguments\n"
        "    raise KeyboardInterrupt\n"
        "click.Group.parse_args = parse_args\n"
        "main(['inspect', 'q', '--redis-url', 'redis://127.0.0.1:1/0'])\n"
    )
    proc = run_python("-c", code)
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, "keyqueue: interrupted\n", "")


# Ctrl-C at a moment of the command's first 0.1 s: SIGALRM's handler raises
# KeyboardInterrupt, as SIGINT's does, at a moment set by an interval timer
# started once the console script has its entry point (the [project.scripts]
# module, which imports nothing of keyqueue: see the test below), so the
# package's import, click's and the command's are all in the window.
_CTRL_C_AT = (
    "import signal, sys\n"
    "from {module} import {function}\n"
    "def ctrl_c(signum, frame):\n"
    "    raise KeyboardInterrupt\n"
    "signal.signal(signal.SIGALRM, ctrl_c)\n"
    "signal.setitimer(signal.ITIMER_REAL, float(sys.argv[1]))\n"
    "sys.argv[1:2] = []\n"
    "sys.exit({function}())\n"
)


def test_the_console_script_entry_point_imports_nothing_before_it_can_take_ctrl_c() -> None:
    # Its import is the one moment no code of ours can take Ctrl-C: keep it
    # the import of a module of nothing (keyqueue.cli ran keyqueue/__init__).
    module, _ = _console_script()
    tree = ast.parse((ROOT / "src" / f"{module}.py").read_text())
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert [alias.name for node in imports for alias in node.names] == ["sys"]
    code = f"import sys; import {module}; print(sorted(m for m in sys.modules if 'keyqueue' in m))"
    assert run_python("-c", code).stdout == f"['{module}']\n"


def _console_script() -> tuple[str, str]:
    """The ``keyqueue`` script's entry point in pyproject.toml: (module, function)."""
    import tomllib  # noqa: PLC0415

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["keyqueue"].partition(":")
    return module, function


@pytest.mark.parametrize(
    "command",
    [
        ["inspect", "q", "--redis-url", "redis://127.0.0.1:1/0"],
        ["lab", "model", "--plain"],
        ["lab", "backoff", "--plain"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_ctrl_c_in_the_first_tenth_of_a_second_prints_no_traceback(command: list[str]) -> None:
    module, function = _console_script()
    script = _CTRL_C_AT.format(module=module, function=function)
    interrupted = 0
    for at in (0.001, 0.003, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1):
        proc = run_python("-c", script, str(at), *command)
        assert "Traceback" not in proc.stderr, (at, proc.stderr)
        assert "Aborted" not in proc.stderr, (at, proc.stderr)
        if proc.returncode == 130:
            interrupted += 1
            assert proc.stderr.endswith("interrupted\n"), (at, proc.stderr)
        else:  # it ended before the moment came: as it ends on its own
            assert proc.returncode in (0, 1), (at, proc.returncode, proc.stderr)
    assert interrupted >= 2  # the early moments did land in the command


def test_lab_options_say_milliseconds_one_way_and_a_guess_finds_duration() -> None:
    firehose = invoke("lab", "firehose", "--help").output
    assert "--reconcile-ms" in firehose
    assert "--reconcile " not in firehose  # the old name works, unlisted
    assert "--reconcile-ms" in invoke("lab", "pipeline", "--help").output
    old = invoke(
        "lab", "firehose", "--json", "--duration", "0.2", "--rate", "50", "--reconcile", "2"
    )
    assert old.exit_code == 0, old.output
    assert json.loads(old.stdout)["config"]["reconcile"] == 0.002
    for command in ("firehose", "fairness"):
        guess = invoke("lab", command, "--seconds", "3")
        assert guess.exit_code == 2
        assert "No such option '--seconds'. Did you mean '--duration'?" in guess.stderr
    typo = invoke("lab", "firehose", "--reconcile-s", "3")
    assert "Did you mean '--reconcile-ms'?" in typo.stderr  # not the hidden --reconcile


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
        "COALESCED",
        "COALESCED",
        "WORKER Done",
        "REDELIVERY",
        "WORKER Get",
        "WORKER Done",
    ]
    # Line numbers count every printed trace line, in order.
    assert [n for n, *_ in trace] == list(range(1, len(trace) + 1))
    # The summary points at those very lines.
    mark, coalesced1, coalesced2, redelivery, get = (web[i][0] for i in (2, 3, 4, 6, 7))
    summary = result.output.split("The proof")[1]
    assert re.search(rf"line {mark}\s+\[REQUEUE-WHILE-PROCESSING\]", summary)
    assert re.search(rf"lines {coalesced1}, {coalesced2}\s+\[COALESCED\]", summary)
    assert re.search(rf"line {redelivery}\s+\[REDELIVERY\]", summary)
    assert re.search(rf"line {get}\s+\[WORKER-\d+\] Get seq=", summary)


def test_slowmo_result_holds_the_proof_and_consistent_stats() -> None:
    result = run_slowmo(SlowmoConfig(speed=200))
    assert not result.interrupted
    proof = result.proof
    assert proof is not None
    assert proof.key == PROOF_KEY
    assert proof.mark.n < proof.coalesced[0].n < proof.coalesced[1].n < proof.redelivery.n
    assert proof.redelivery.n < proof.get.n
    assert proof.held_seq is not None
    assert proof.get.seq is not None
    assert proof.get.seq > proof.held_seq
    s = result.stats
    # The counters match the trace: one line per transition the queue reported,
    # one WORKER Get and one Done line per key handed out.
    tags = [f"{x.tag} {x.action}" if x.tag == "WORKER" else x.tag for x in result.lines]
    assert (s.enqueued, s.coalesced, s.marked_while_processing, s.redeliveries) == (
        tags.count("ENQUEUE"),
        tags.count("COALESCED"),
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
    assert len(data["proof"]["coalesced_lines"]) == 2
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
    summary = "\n".join(str(r) for r in slowmo_render.slowmo_summary(result))
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

    monkeypatch.setattr(firehose_render, "firehose_stats_line", interrupt)
    result = invoke("lab", "firehose", *SHORT_FIREHOSE, "--duration", "30", "--plain")
    assert result.exit_code == 130
    assert "Summary (interrupted)" in result.output
    assert "absorbed" in result.output


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT delivery")
def test_ctrl_c_on_the_real_command_prints_the_summary() -> None:
    returncode, out, err = _ctrl_c_at_the_first_stats_line(
        ["lab", "firehose", "--plain", "--duration", "60", "--rate", "2000"], watchdog=30
    )
    assert returncode == 130, err
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
    assert _format.roughly(x) == words


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


# -- a closed output pipe ----------------------------------------------------------

PIPE_CLOSERS = {
    "slowmo": ["lab", "slowmo", "--speed", "2"],
    "firehose": ["lab", "firehose", "--duration", "30", "--rate", "2000"],
    "backoff": ["lab", "backoff", "--attempts", "1000", "--herd", "150"],
    "model": ["lab", "model", "--steps", "1000"],
}


def small_pipe() -> tuple[int, int]:
    """A pipe holding one page, so a child writing a screenful blocks until
    the reader reads or closes: the write into the closed pipe is certain."""
    fcntl = pytest.importorskip("fcntl")
    if not hasattr(fcntl, "F_SETPIPE_SZ"):
        pytest.skip("needs Linux to size the pipe")
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    return read_end, write_end


def read_lines(fd: int, lines: int, timeout: float) -> bytes:
    """Up to ``lines`` lines from ``fd``; returns early at end of file or after
    ``timeout`` seconds (a child that dies or stalls cannot hang the test)."""
    data = b""
    deadline = time.monotonic() + timeout
    while data.count(b"\n") < lines:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.skipif(sys.platform == "win32", reason="select on pipes")
@pytest.mark.parametrize("name", list(PIPE_CLOSERS))
def test_closed_output_pipe_ends_the_command_at_once_and_quietly(name: str) -> None:
    # `keyqueue lab slowmo | head -2`: the reader takes two lines and leaves.
    read_end, write_end = small_pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "keyqueue", *PIPE_CLOSERS[name]],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(write_end)
    try:
        first = read_lines(read_end, 2, timeout=30)
        os.close(read_end)
        _, err = proc.communicate(timeout=30)  # today's slowmo never ends here
    finally:
        proc.kill()
        proc.wait()
    assert first.count(b"\n") >= 2, (first, proc.returncode)
    assert proc.returncode == 1
    assert err == ""  # no traceback, no "Exception ignored ... BrokenPipeError"


def test_slowmo_stops_and_raises_when_printing_fails_in_a_worker() -> None:
    printed: list[int] = []

    def on_line(line: Any) -> None:
        if line.tag == "WORKER":  # a worker thread prints this one
            raise BrokenPipeError
        printed.append(line.n)

    with pytest.raises(BrokenPipeError):
        run_slowmo(SlowmoConfig(speed=2), on_line=on_line)
    assert printed == [1]  # the first ENQUEUE; nothing printed after the failure


def test_firehose_stops_its_threads_when_printing_fails() -> None:
    before = set(threading.enumerate())

    def on_tick(tick: FirehoseTick) -> None:
        raise BrokenPipeError

    config = FirehoseConfig(
        rate=1000, keys=5, duration=30, reconcile=0.001, failure_rate=0, tick=0.05
    )
    with pytest.raises(BrokenPipeError):
        run_firehose(config, on_tick=on_tick)
    assert all(not t.is_alive() for t in set(threading.enumerate()) - before)


# -- firehose keys -----------------------------------------------------------------


def test_firehose_keys_are_drawn_from_the_whole_range() -> None:
    draw = key_draws(10_000_000, seed=1)
    keys = draw(20_000)
    # 20,000 uniform draws over ten million keys repeat about 20 times.
    assert len(set(keys)) >= 19_900
    assert all(re.fullmatch(r"default/pod-\d{3,8}", key) for key in keys)
    assert keys == key_draws(10_000_000, seed=1)(20_000)  # seeded: the same run twice
    assert keys != key_draws(10_000_000, seed=2)(20_000)
    few = key_draws(5, seed=1)(1000)
    assert set(few) == {key_name(i) for i in range(5)}


def test_firehose_with_many_keys_does_not_build_them_first() -> None:
    config = FirehoseConfig(
        rate=1000, keys=1_000_000, duration=0.05, workers=1, reconcile=0, failure_rate=0
    )
    tracemalloc.start()
    try:
        result = run_firehose(config)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.events > 0
    assert peak < 2_000_000  # a list of a million names alone is ~70 MB


# -- option values -----------------------------------------------------------------

FLOAT_OPTIONS = [
    ("slowmo", "--speed"),
    ("slowmo", "--hold"),
    ("slowmo", "--rate"),
    ("firehose", "--rate"),
    ("firehose", "--duration"),
    ("firehose", "--reconcile-ms"),
    ("firehose", "--reconcile"),  # its old name, hidden
    ("firehose", "--failure-rate"),
    ("backoff", "--base"),
    ("backoff", "--cap"),
    ("model", "--arrival"),
    ("model", "--lambda"),
    ("model", "--service"),
    ("model", "--mu"),
    ("model", "--backlog"),
]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "infinity"])
@pytest.mark.parametrize(("command", "option"), FLOAT_OPTIONS)
def test_non_finite_option_values_are_one_line_usage_errors(
    command: str, option: str, value: str
) -> None:
    result = invoke("lab", command, option, value)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"'{option}'" in lines[0]
    assert "is not a finite number" in lines[0]


def test_every_float_option_is_checked_for_finite_values() -> None:
    from keyqueue._console.options import FiniteFloatRange  # noqa: PLC0415
    from keyqueue.lab.cli import lab  # noqa: PLC0415

    tested = {(command, option) for command, option in FLOAT_OPTIONS}
    for name, command in lab.commands.items():
        for param in command.params:
            if isinstance(param.type, click.FloatRange):
                assert isinstance(param.type, FiniteFloatRange), (name, param.name)
                if name in PIPE_CLOSERS:  # the four subcommands tested above
                    assert {(name, opt) for opt in param.opts} <= tested, (name, param.opts)


def test_non_finite_option_on_the_real_command_has_no_traceback() -> None:
    proc = run_python("-m", "keyqueue", "lab", "slowmo", "--speed", "nan")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert "'--speed': 'nan' is not a finite number" in proc.stderr


# -- the lab's words and numbers ---------------------------------------------------

NO_SEPARATOR = re.compile(r"(?<![\d.,])\d{4,}|\de[+-]\d")
"""A number of 1,000 or more written without separators, or with an exponent."""


def test_slowmo_header_trace_and_summary_use_seconds() -> None:
    result = invoke("lab", "slowmo", *FAST_SLOWMO, "--plain")
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[0]
    assert "4 keys, 2 workers, 400 events/s, each key held 0.003s" in header
    assert "times are seconds" in header
    assert re.findall(r"\d ?(µs|ms|min|m|h)\b", result.output) == []
    assert re.search(r"backoff=0\.0025s", result.output)  # 0.25 s at speed 100
    assert re.search(r"Summary: [\d.]+s at speed 100", result.output)


def test_slowmo_says_coalesced_and_names_each_tags_stats_counter() -> None:
    result = invoke("lab", "slowmo", *FAST_SLOWMO, "--plain")
    assert result.exit_code == 0, result.output
    assert "dedup" not in result.output.lower()
    trace = parse_trace(result.output)
    tags = [tag for _, tag, _, _ in trace]
    summary = result.output.split("Summary")[1]
    for counter, tag in (
        ("enqueued", "ENQUEUE"),
        ("coalesced", "COALESCED"),
        ("marked while processing", "REQUEUE-WHILE-PROCESSING"),
        ("redeliveries", "REDELIVERY"),
    ):
        said = "redelivery" if tags.count(tag) == 1 and counter == "redeliveries" else counter
        assert f"{tags.count(tag)} {said} [{tag}]" in summary
    help_text = invoke("lab", "slowmo", "--help").output
    assert "dedup" not in help_text.lower()
    assert re.search(r"REQUEUE-WHILE-PROCESSING\s+marked_while_processing", help_text)


def test_the_docs_say_coalesced_not_dedup() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lab = (ROOT / "docs" / "lab.md").read_text(encoding="utf-8")
    assert "dedup" not in readme.lower()
    assert "dedup" not in lab.lower()
    assert re.search(r"`\[REQUEUE-WHILE-PROCESSING\]`[^.]*`Stats\.marked_while_processing`", lab)


@pytest.mark.parametrize(
    "args",
    [
        ["lab", "slowmo", "--speed", "1000", "--plain"],
        ["lab", "backoff", "--cap", "100000", "--herd", "20000", "--attempts", "1000"],
        ["lab", "model", "--arrival", "4000", "--service", "3000", "--backlog", "4000"],
        ["lab", "model", "--arrival", "2999.9", "--service", "3000", "--steps", "1000"],
    ],
)
def test_every_number_the_lab_prints_has_thousands_separators(args: list[str]) -> None:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert NO_SEPARATOR.findall(result.output) == []
    assert re.search(r"\d,\d{3}", result.output)  # and there are such numbers


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "0 retries coming due"),
        (1, "1 retry coming due"),
        (2, "2 retries coming due"),
        (1_000, "1,000 retries coming due"),
    ],
)
def test_counted_writes_the_noun_that_agrees_with_its_number(n: int, words: str) -> None:
    assert counted(n, "retry coming due", "retries coming due") == words
    assert counted(n, "key") == words.replace("retries coming due", "keys").replace(
        "retry coming due", "key"
    )


def one_of_each(**changes: int) -> Stats:
    """A queue's stats with ``changes`` set (every other counter 0)."""
    return dataclasses.replace(WorkQueue[str]().stats(), **changes)


def test_slowmo_summary_says_one_retry_one_redelivery_one_worker() -> None:
    stats = one_of_each(adds=2, enqueued=1, marked_while_processing=1, redeliveries=1, dones=1)
    result = SlowmoResult(
        config=SlowmoConfig(workers=1), lines=(), stats=stats, proof=None, elapsed=1.0, events=1
    )
    text = plain(slowmo_render.slowmo_summary(result))

    assert "1 event from the generator and 1 retry coming due = 2 adds:" in text
    assert "→ 1 redelivery [REDELIVERY]" in text
    assert "1 reconcile by 1 worker," in text
    for wrong in ("1 retries", "1 redeliveries", "1 workers", "1 events", "1 reconciles"):
        assert wrong not in text


def test_pipeline_summary_says_one_object_and_one_redelivery() -> None:
    stats = one_of_each(adds=1, enqueued=1, redeliveries=1, gets=1, dones=1)
    result = PipelineResult(
        config=PipelineConfig(),
        url="http://127.0.0.1:1",
        etcd="http://127.0.0.1:2",
        elapsed=1.0,
        triggers=1,
        created=1,
        failed=0,
        watch_events=1,
        stats=stats,
        stages=(),
        objects=1,
        stale=(),
    )
    text = plain(pipeline_render.summary(result))

    assert "1 trigger onto 1 object (1 created" in text
    assert "→ 1 watch event → 1 add → 1 reconcile" in text
    assert "→ 1 redelivery" in text
    assert "The one object was reconciled at its final version." in text
    for wrong in ("1 objects", "1 redeliveries", "1 triggers", "1 adds"):
        assert wrong not in text


def plain(renderables: list[Any]) -> str:
    console = Console(width=400, color_system=None, record=True)
    for renderable in renderables:
        console.print(renderable)
    return console.export_text()


def big_tick(**changes: Any) -> FirehoseTick:
    p = Percentiles(12_345, 1.2345, 2.5, 12.5)
    tick = FirehoseTick(
        t=1234.5,
        events=12_345_678,
        event_rate=45_678.9,
        adds=12_345_678,
        enqueued=123_456,
        coalesced=12_000_000,
        marked_while_processing=222_222,
        processed=345_678,
        rate_limited=4_567,
        depth=23_456,
        max_depth=34_567,
        processing=1_234,
        absorbed=97.2,
        queue_wait=p,
        reconcile=p,
    )
    return dataclasses.replace(tick, **changes)


def test_firehose_prints_big_numbers_with_separators() -> None:
    config = FirehoseConfig(
        rate=1_000_000, keys=5_000_000, duration=3600, workers=200, reconcile=12.5, seed=12345
    )
    tick = big_tick()
    result = FirehoseResult(
        config=config,
        elapsed=3600.0,
        events=12_345_678,
        achieved_rate=3429.4,
        kept_up=False,
        stats=Stats(
            adds=12_345_678,
            enqueued=123_456,
            coalesced=12_000_000,
            marked_while_processing=222_222,
            redeliveries=222_222,
            gets=345_678,
            dones=345_678,
            retries=4_567,
            rate_limited=4_567,
            rate_limit_delay_seconds=0.0,
            max_rate_limit_delay_seconds=0.0,
            depth=0,
            max_depth=34_567,
            processing=0,
            delayed=0,
            queue_wait_seconds=1.0,
            work_seconds=1.0,
            shutting_down=True,
            waiting_by_priority={},
            oldest_wait_seconds=0.0,
        ),
        absorbed=97.2,
        reconciles_per_second=1234.5,
        failures=5_678,
        gave_up=1_111,
        queue_wait=tick.queue_wait,
        reconcile=tick.reconcile,
        drained_in=1234.5,
        ticks=(tick,),
    )
    console = Console(width=400, color_system=None, record=True)
    for renderable in (
        firehose_render.firehose_header(config),
        firehose_render.firehose_stats_line(tick),
        firehose_render.firehose_stats_line(big_tick(draining=True)),
        firehose_render.firehose_panel(tick, 3600, 3600, config.rate),
        firehose_render.firehose_panel(big_tick(draining=True, t=4834.5), 3600, 3600, config.rate),
        *firehose_render.firehose_summary(result),
    ):
        console.print(renderable)
    text = console.export_text().replace("seed 12345", "seed")  # a seed is an identifier
    assert NO_SEPARATOR.findall(text) == []
    for shown in ("23,456", "34,567", "5,000,000", "1.23/2.50/12.50s", "3,600"):
        assert shown in text


def test_firehose_live_and_final_achieved_rates_agree() -> None:
    config = FirehoseConfig(rate=3000, keys=5, duration=0.25, workers=2, reconcile=0.001, tick=0.1)
    result = run_firehose(config)
    firing = [tick for tick in result.ticks if not tick.draining]
    assert len(firing) >= 2
    assert firing[-1].event_rate == result.achieved_rate
    assert firing[-1].events == result.events


def test_firehose_plain_last_stats_line_shows_the_achieved_rate() -> None:
    result = invoke("lab", "firehose", *SHORT_FIREHOSE, "--plain")
    assert result.exit_code == 0, result.output
    live = re.findall(r"^\[STATS\] .* events=[\d,]+ \(([\d,]+)/s\)", result.output, re.M)
    final = re.findall(r"achieved ([\d,]+)/s", result.output)
    assert live
    assert final == [live[-1]]


def test_firehose_shows_the_drain_as_it_goes() -> None:
    # 400 events onto a million keys: nearly every event is a new key, and one
    # worker taking at least 1 ms a key leaves hundreds to drain after firing.
    config = FirehoseConfig(
        rate=4000,
        keys=1_000_000,
        duration=0.1,
        workers=1,
        reconcile=0.002,
        failure_rate=0,
        tick=0.02,
    )
    seen: list[FirehoseTick] = []
    result = run_firehose(config, on_tick=seen.append)
    assert seen == list(result.ticks)
    draining = [tick for tick in seen if tick.draining]
    assert len(draining) >= 2
    assert all(not tick.draining for tick in seen[: len(seen) - len(draining)])
    assert all(tick.events == result.events for tick in draining)
    assert draining[0].depth > 0  # keys were still waiting: that is what it shows
    processed = [tick.processed for tick in draining]
    assert processed == sorted(processed)
    assert result.drained_in >= 0.02 * len(draining)
    assert result.stats.depth == 0
    line = firehose_render.firehose_stats_line(draining[0])
    assert re.match(r"\[DRAIN\] t=[\d.,]+s waiting=[\d,]+ held=\d processed=[\d,]+ ", line)


def test_firehose_keeps_the_give_ups_of_its_simulated_failures_off_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Every reconcile fails; the drain gives up what is left (no retries after
    # shutdown). The summary counts those; the log keeps real errors only.
    config = FirehoseConfig(
        rate=2000, keys=1_000_000, duration=0.05, workers=1, reconcile=0.001, failure_rate=0.99
    )
    with caplog.at_level(logging.WARNING, logger="keyqueue"):
        result = run_firehose(config)
    assert result.gave_up > 0
    assert result.failures >= result.gave_up
    assert caplog.records == []
    summary = "\n".join(str(x) for x in firehose_render.firehose_summary(result))
    assert f"{result.gave_up:,} given up in the drain" in summary


def test_runner_warnings_about_simulated_failures_are_dropped_only_during_a_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("keyqueue")
    message = "key %r failed while the queue is shutting down, cannot retry, giving up: %r"
    with caplog.at_level(logging.WARNING, logger="keyqueue"):
        with quiet_simulated_give_ups():
            log.warning(message, "a", SimulatedFailure("a"))
            log.warning(message, "b", RuntimeError("b"))  # a real error: still logged
        log.warning(message, "c", SimulatedFailure("c"))
    assert [record.getMessage()[:7] for record in caplog.records] == ["key 'b'", "key 'c'"]


def test_slowmo_dims_only_the_line_number_and_time() -> None:
    line = TraceLine(12, 1.25, "COALESCED", PROOF_KEY, f"[COALESCED] key={PROOF_KEY} (x)")
    text = slowmo_render.slowmo_line(line)
    assert text.plain == f"  12     1.25s [COALESCED] key={PROOF_KEY} (x)"
    console = Console()
    dim = [i for i in range(len(text.plain)) if text.get_style_at_offset(console, i).dim]
    assert dim == list(range(len("  12     1.25s")))


# -- set-up: the Makefile and the README -------------------------------------------

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def make_in(tmp_path: Path, *args: str, dry_run: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the project's Makefile in an empty copy of the project (nothing installs)."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").touch(exist_ok=True)
    command = ["make", "-n", *args] if dry_run else ["make", *args]
    # Run as a top-level make, also when the suite itself runs under `make test`
    # (an inherited MAKELEVEL makes the child print "Entering directory").
    env = {k: v for k, v in os.environ.items() if k not in {"MAKELEVEL", "MAKEFLAGS", "MFLAGS"}}
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def fake_venv_python(tmp_path: Path, script: str | None = None) -> None:
    """``.venv/bin/python``: ``script`` (a shell script), or this test's Python."""
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    if script is None:
        python.symlink_to(sys.executable)
    else:
        python.write_text(f"#!/bin/sh\n{script}\n")
        python.chmod(0o755)


@needs_make
def test_make_makes_the_venv_again_when_another_python_made_it(tmp_path: Path) -> None:
    fake_venv_python(tmp_path, "echo 3.9.0 /opt/an-old-python")
    proc = make_in(tmp_path, "lab", f"PYTHON={sys.executable}")
    assert proc.returncode == 0, proc.stderr
    assert "runs another Python (3.9.0 /opt/an-old-python)" in proc.stdout
    assert "rm -rf .venv" in proc.stdout
    assert f"{sys.executable} -m venv .venv" in proc.stdout


@needs_make
def test_make_keeps_a_venv_made_by_the_same_python(tmp_path: Path) -> None:
    fake_venv_python(tmp_path)
    (tmp_path / "pyproject.toml").touch()
    stamp = tmp_path / ".venv" / ".installed-lab"
    stamp.touch()
    os.utime(stamp, (time.time() + 60, time.time() + 60))  # installed after the last edit
    proc = make_in(tmp_path, "lab", f"PYTHON={sys.executable}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [".venv/bin/keyqueue lab firehose"]


@needs_make
def test_make_with_a_python_older_than_3_11_says_so(tmp_path: Path) -> None:
    old = tmp_path / "python3.10"
    old.write_text("#!/bin/sh\nexit 1\n")  # fails the version check, as 3.10 would
    old.chmod(0o755)
    proc = make_in(tmp_path, "test", f"PYTHON={old}", dry_run=False)
    assert proc.returncode != 0
    assert "keyqueue needs Python >= 3.11" in proc.stderr
    assert not (tmp_path / ".venv").exists()


def readme_section(title: str) -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_readme_states_the_python_that_pyproject_requires() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    minimum = re.search(r'requires-python = ">=(\d+\.\d+)"', pyproject)
    assert minimum is not None
    setup = readme_section("On a fresh machine")
    assert f"Python {minimum[1]} or newer" in setup
    assert ".venv/bin/keyqueue" in setup
    assert "source .venv/bin/activate" in setup


def test_readme_threads_example_runs_and_checks_the_drain() -> None:
    code = readme_section("Example: threads").split("```python\n", 1)[1].split("```", 1)[0]
    assert re.search(r"^if not queue\.shutdown\(drain=True", code, re.MULTILINE)
    proc = run_python("-c", code)  # the `...` placeholders are expressions: it runs as is
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # nothing to drain, so no timeout


def _ctrl_c_at_the_first_stats_line(command: list[str], watchdog: float) -> tuple[int, str, str]:
    """Run ``keyqueue *command`` as a foreground one would (Python's SIGINT handler
    even when the suite was started with SIGINT ignored), press Ctrl-C at its first
    [STATS] line, and return its status, stdout and stderr. A child that dies
    early or never prints one fails the test instead of hanging it: readline
    returns "" at end of file, and the watchdog kills a child that stays silent."""
    proc = subprocess.Popen(
        [sys.executable, "-c", FOREGROUND, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    timer = threading.Timer(watchdog, proc.kill)
    timer.start()
    try:
        first_line(proc, "[STATS]")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        timer.cancel()
        proc.kill()
        proc.wait()
    return proc.returncode, out, err


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and SIGINT")
def test_ctrl_c_in_a_long_fairness_run_is_one_line_and_exit_130() -> None:
    # 57 s of computing: SIGINT once it has used 2 s of CPU (its imports take
    # a fraction of one), so it lands inside the run, whatever the machine.
    command = ["lab", "fairness", "--plain", "--relist", "1000000", "--service", "0.0036"]
    proc = subprocess.Popen(
        [sys.executable, "-c", FOREGROUND, *command, "--duration", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while _cpu_seconds(proc.pid) < 2.0:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run used no CPU"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert err == "keyqueue lab fairness: interrupted\n"
    assert out == ""


@pytest.mark.parametrize("command", ["backoff", "fairness", "model"])
def test_ctrl_c_in_a_command_without_a_summary_says_interrupted_not_aborted(
    monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    def interrupt(*args: object, **kwargs: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(f"keyqueue.lab.{command}.render.render_{command}", interrupt)
    result = invoke(
        "lab", command, "--plain", *(["--relist", "10"] if command == "fairness" else [])
    )
    assert result.exit_code == 130
    assert "Aborted" not in result.output
    assert result.stderr == f"keyqueue lab {command}: interrupted\n"


def _closed_port() -> int:
    import socket  # noqa: PLC0415 (this test only)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once closed


@pytest.mark.parametrize(
    ("args", "status"),
    [
        (["web", "--port", "70000"], 2),
        (["web", "--host", "nosuchhost.invalid", "--no-open"], 2),
        (["firehose", "--rate", "0"], 2),
        (["pipeline", "--etcd", "http://127.0.0.1:{port}", "--plain"], 1),
        (["firehose", "--backend", "redis", "--redis-url", "redis://127.0.0.1:{port}/0"], 1),
    ],
)
def test_every_error_is_one_line_in_one_shape(args: list[str], status: int) -> None:
    port = _closed_port()
    result = invoke("lab", *(a.format(port=port) for a in args))
    assert result.exit_code == status, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"keyqueue lab {args[0]}: error: "), line
    assert "Error:" not in result.output


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT delivery")
def test_the_interrupted_firehose_summary_adds_up() -> None:
    # Many keys and slow reconciles: at Ctrl-C keys are waiting and held.
    returncode, out, err = _ctrl_c_at_the_first_stats_line(
        [
            "lab",
            "firehose",
            "--plain",
            "--duration",
            "60",
            "--keys",
            "100000",
            "--reconcile-ms",
            "20",
        ],
        watchdog=60,
    )
    assert returncode == 130, err
    n = r"([\d,]+)"
    found = re.search(
        rf"{n} reconciles by \d+ workers \({n} enqueued \+ {n} redelivered keys"
        rf"(?: = {n} handed out(?: \+ {n} still waiting)?(?:; {n} still held[^)]*)?| handed out)\)",
        out,
    )
    assert found is not None, out
    done, enqueued, redelivered, handed, waiting, held = (
        int(g.replace(",", "")) if g else 0 for g in found.groups()
    )
    handed = handed or done
    assert enqueued + redelivered == handed + waiting, out
    assert done == handed - held, out
    assert waiting > 0, out  # the case that matters: keys still waiting at the end


def test_the_producer_stops_at_the_duration_even_when_adds_are_slow() -> None:
    # Each add costs 30 µs (a contended queue, a slow machine): a fixed batch
    # of 5 ms' worth at 1,000,000/s took 150 ms and fired past the end.
    def slow_add_batch(keys: list[str]) -> None:
        time.sleep(len(keys) * 30e-6)

    config = FirehoseConfig(rate=1_000_000, duration=0.5)
    producer = Producer(config, threading.Event(), slow_add_batch)
    producer.run()
    fired_for = producer.finished_at - producer.started_at
    assert 0.5 <= fired_for < 0.53, fired_for
    assert 0 < producer.sent < 0.5 * 1_000_000


def test_waits_past_one_second_are_shown_in_seconds() -> None:
    fast = percentiles([0.0411, 0.0624, 0.0777])
    slow = percentiles([0.9138, 1.771, 1.8538])
    assert firehose_render._pcts(fast) == "62.4/77.7/77.7ms"
    assert firehose_render._pcts(slow) == "1.77/1.85/1.85s"


def test_the_firehose_says_up_front_how_long_the_drain_will_take() -> None:
    # One worker, 4 ms a key, about 800 distinct keys left when firing ends:
    # a drain of about 3 s, which the line before it says.
    result = invoke(
        "lab", "firehose", "--plain", "--rate", "1000", "--duration", "1", "--keys", "1000000",
        "--workers", "1", "--failure-rate", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    (at,) = [i for i, line in enumerate(lines) if "the drain will take about" in line]
    assert lines[at - 1].startswith("[STATS] t=1.0s")  # up front: right as firing ends
    assert all(line.startswith("[DRAIN] t=") for line in lines[at + 1 : at + 3])
    said = re.search(r"the drain will take about ([\d.]+)s", lines[at])
    took = re.search(r"drained in ([\d.]+)s after the last event", result.output)
    assert said is not None, result.output
    assert took is not None, result.output
    assert 0.5 < float(said.group(1)) / float(took.group(1)) < 2, (said, took)


def test_a_firehose_past_what_the_machine_can_fire_still_stops_on_time() -> None:
    started = time.monotonic()
    result = invoke("lab", "firehose", "--plain", "--rate", "1000000", "--duration", "2")
    assert result.exit_code == 0, result.output
    stats = [line for line in result.output.splitlines() if line.startswith("[STATS]")]
    # One a second (a loaded machine may print one a little late: t=2.1s).
    assert [round(float(line.split()[1][2:-1])) for line in stats] == [1, 2], stats
    fired = re.search(r"events onto 20 keys in ([\d.]+)s", result.output)
    assert fired is not None, result.output
    # A batch sized by the rate, not by what an add costs, takes 3.3 s. The
    # margin is for the machine, not the command: at load 10 on two cores the
    # producer thread was seen to get no CPU for ~0.5 s (2.5 s).
    assert float(fired.group(1)) < 3.0, result.output
    assert time.monotonic() - started < 10


ONE_PLURAL = re.compile(
    r"\b1 (workers|keys|adds|events|reconciles|objects|retries|redeliveries|steps|attempts"
    r"|calls|triggers)\b"
)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["slowmo", *FAST_SLOWMO, "--workers", "1"], ["4 keys, 1 worker, "]),
        (
            ["firehose", "--rate", "1", "--duration", "1", "--keys", "1", "--workers", "1"],
            ["1 event/s onto 1 key for", "1 event onto 1 key in", "1 add = ", "1 reconcile by"],
        ),
        (
            ["backoff", "--herd", "1", "--attempts", "1"],
            ["within 1 attempt.", "1 key fails at once", "1 key came back after only its"],
        ),
        (["model", "--lambda", "1", "--mu", "2", "--backlog", "1"], ["λ=1 key/step", "1 key in"]),
    ],
)
def test_counts_of_one_take_the_singular(args: list[str], expected: list[str]) -> None:
    result = invoke("lab", *args, "--plain")
    assert result.exit_code == 0, result.output
    assert ONE_PLURAL.search(result.output) is None, result.output
    for text in expected:
        assert text in result.output, result.output


def test_an_interrupted_firehose_says_so_and_claims_no_rate() -> None:
    # Ctrl-C at 0.3 s of a 10 s run: 300 events, 9 reconciles. Not, as if the run
    # had ended: "This machine could not keep up: the producer fired only 1,000 events a
    # second" and "about thirty reconciles a second"; 0 events (Ctrl-C during
    # start-up) said the producer fired "only 0 events a second".
    config = FirehoseConfig(rate=50_000, duration=10.0)
    for events, dones, elapsed in ((300, 9, 0.3), (0, 0, 0.0)):
        stats = _summary_stats(adds=events, enqueued=min(events, 9), dones=dones)
        result = firehose_result(
            config,
            elapsed=elapsed,
            events=events,
            drained_in=0.0,
            stats=stats,
            failures=0,
            gave_up=0,
            waits=[0.001] * dones,
            works=[0.004] * dones,
            ticks=[],
            interrupted=True,
        )
        text = "\n".join(str(line) for line in firehose_render.firehose_summary(result))
        assert f"Interrupted after {elapsed:.1f}s of the 10.0s asked" in text
        assert "keep up" not in text
        assert "a second" not in text
        assert firehose_render.firehose_headline(result) == (
            f"Interrupted: {counted(events, 'event')}, "
            f"{'0.0%' if not events else '97.0%'} absorbed, "
            f"{counted(dones, 'reconcile')} in {elapsed:.1f}s."
        )


def _summary_stats(*, adds: int, enqueued: int, dones: int) -> Stats:
    return Stats(
        adds=adds,
        enqueued=enqueued,
        coalesced=adds - enqueued,
        marked_while_processing=0,
        redeliveries=0,
        gets=dones,
        dones=dones,
        retries=0,
        rate_limited=0,
        rate_limit_delay_seconds=0.0,
        max_rate_limit_delay_seconds=0.0,
        depth=enqueued - dones,
        max_depth=enqueued,
        processing=0,
        delayed=0,
        queue_wait_seconds=0.0,
        work_seconds=0.0,
        shutting_down=True,
        waiting_by_priority={0: enqueued - dones},
        oldest_wait_seconds=0.0,
    )


def test_the_firehose_headline_words_agree_with_their_counts() -> None:
    assert firehose_render._roughly(1, "event") == "one event"
    assert firehose_render._roughly(0.3, "reconcile") == "less than one reconcile"
    assert firehose_render._roughly(0, "event") == "no events"
    assert firehose_render._roughly(1000, "reconcile") == "a thousand reconciles"


def test_an_interrupted_drain_counts_the_drain_so_far_in_the_reconcile_rate() -> None:
    # One worker, 4 ms a key, about 300 distinct keys when firing ends: a drain
    # of about 1.2 s, interrupted after about 0.3 s of it. The rate divides by
    # the firing time and the drain so far, not the firing time alone.
    config = FirehoseConfig(
        rate=1000, duration=0.3, keys=1_000_000, workers=1, failure_rate=0, tick=0.1
    )
    draining = 0

    def on_tick(tick: FirehoseTick) -> None:
        nonlocal draining
        draining += tick.draining
        if draining == 3:
            raise KeyboardInterrupt

    started = time.monotonic()
    result = run_firehose(config, on_tick=on_tick)
    wall = time.monotonic() - started
    assert result.interrupted
    assert result.drained_in == 0
    assert result.stats.dones > 0
    ran_for = result.stats.dones / result.reconciles_per_second
    assert result.elapsed + 0.25 <= ran_for <= wall, (result.elapsed, ran_for, wall)


# -- keyqueue lab valkey: a server to try keyqueue.redis on ----------------------------


def _lab_valkey(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "keyqueue", "lab", "valkey", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _first_line_within(proc: subprocess.Popen[str], seconds: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    assert ready, "keyqueue lab valkey printed nothing"
    return proc.stdout.readline()


def _port_refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.parametrize(
    ("sig", "code", "said"),
    [(signal.SIGINT, 130, "keyqueue lab valkey: stopped\n"), (signal.SIGTERM, 0, "")],
)
def test_lab_valkey_serves_a_queue_on_loopback_until_ctrl_c_or_sigterm(
    sig: signal.Signals, code: int, said: str
) -> None:
    json_mode = sig == signal.SIGTERM  # one run of each output mode
    proc = _lab_valkey("--port", "0", *(["--json"] if json_mode else []))
    try:
        line = _first_line_within(proc, 30)
        if json_mode:
            doc = json.loads(line)
            url, port = doc["url"], doc["port"]
        else:
            found = re.fullmatch(
                r"keyqueue lab valkey: serving on (redis://127\.0\.0\.1:(\d+)/0)"
                r" \(Ctrl-C to stop\)\n",
                line,
            )
            assert found, line
            url, port = found[1], int(found[2])
        assert url == f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        assert client.config_get("bind") == {"bind": "127.0.0.1"}  # loopback only
        assert client.config_get("save") == {"save": ""}  # nothing kept
        client.close()
        with RedisWorkQueue("tried", url=url) as queue:  # what the docs point at it
            queue.add("a")
            queue.add("a")
            assert queue.stats().coalesced == 1
            assert queue.get(timeout=5) == "a"
            queue.done("a")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, err
    assert out == said
    assert "Traceback" not in err
    assert _port_refuses(port)  # the server stopped with it


def test_lab_valkey_on_a_taken_port_is_one_line_and_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _lab_valkey("--port", str(port))
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert out == ""
    assert (
        err
        == f"keyqueue lab valkey: error: 127.0.0.1:{port} is taken: another process listens there\n"
    )
