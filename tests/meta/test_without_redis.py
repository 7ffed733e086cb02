"""The in-memory tests need no redis-py: core/, fronts/ and conformance/ run without it.

``import keyqueue`` never imports redis (meta/test_api.py); this pins the same
for the tests of the in-memory queues, so a change to conftest.py or to a
shared helper that starts importing redis-py at the top fails here. The tests
run in a fresh ``pytest`` process whose ``sitecustomize`` puts ``None`` in
``sys.modules["redis"]`` (every ``import redis`` raises ``ModuleNotFoundError``,
as on a machine without the ``redis`` extra), in that process and in any it
starts. The Redis fronts' conformance tests are skipped there, each saying why;
everything else passes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ["tests/core", "tests/fronts", "tests/conformance"]
AT_LEAST = 750
"""Tests that pass without redis-py (808 when this was written): far fewer
means whole files were skipped or not collected."""


def test_core_fronts_and_in_memory_conformance_pass_without_redis_py(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text('import sys\nsys.modules["redis"] = None\n')
    python_path = [str(tmp_path), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in python_path if p)}
    check = "import sys; import keyqueue\ntry:\n import redis\nexcept ImportError: print('blocked')"
    blocked = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, check=False
    )
    assert blocked.stdout.strip() == "blocked", blocked

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FOLDERS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary)}
    assert counts.get("passed", 0) >= AT_LEAST, summary
    assert not {"failed", "error", "errors"} & counts.keys(), summary
    assert "redis-py is not installed" in done.stdout  # the Redis fronts' skips say why
