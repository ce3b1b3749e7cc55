import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from gateway.runtime.embedded_store import EmbeddedStore, EmbeddedStoreError


def _client(store: EmbeddedStore) -> redis.Redis:
    return redis.Redis(unix_socket_path=str(store.socket_path))


def test_data_survives_a_restart(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path) as store:
        client = _client(store)
        client.set("greeting", "hello")
        client.hset("entry:1", mapping={"prompt": "what is 2+2", "answer": "4"})
        client.close()

    assert (tmp_path / "appendonlydir").is_dir()

    with EmbeddedStore(tmp_path) as store:
        client = _client(store)
        assert client.get("greeting") == b"hello"
        assert client.hgetall("entry:1") == {b"prompt": b"what is 2+2", b"answer": b"4"}
        client.close()


def test_second_owner_of_the_same_directory_is_refused(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path), pytest.raises(EmbeddedStoreError, match="another process"):
        EmbeddedStore(tmp_path).start()


def test_stale_socket_from_a_crash_is_replaced(tmp_path: Path) -> None:
    tmp_path.joinpath("valkey.sock").write_bytes(b"")
    with EmbeddedStore(tmp_path) as store:
        assert _client(store).ping()


def test_server_dies_with_its_parent(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from gateway.runtime.embedded_store import EmbeddedStore\n"
        "store = EmbeddedStore(Path(sys.argv[1])); store.start()\n"
        "print(store._process.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    server_pid = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    parent.stdout.close()

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(server_pid):
        time.sleep(0.05)
    assert not _alive(server_pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); its state letter tells.
    status = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return status not in {"Z", "X"}
