"""The parts of `kvgate serve --workers N` that need no processes: the plan a child is started with, the
supervisor's own footprint, and the settings that choose it (the processes themselves:
tests/integration/test_workers.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.runtime.process_plan import ProcessPlan
from gateway.runtime.settings import Settings


def test_a_plan_survives_its_trip_through_the_command_line() -> None:
    plan = ProcessPlan("worker", Path("/tmp/run"), workers=3, index=2, listen_fd=7, store_url="unix:///s")
    again = ProcessPlan.from_json(plan.to_json())
    assert again == plan
    assert again.engine_socket == Path("/tmp/run/engine.sock")
    assert again.metrics_dir == Path("/tmp/run/metrics")


def test_the_supervisor_loads_no_model_code() -> None:
    # It only starts and watches processes: importing torch or the embedder there would cost ~220 MB.
    script = "import sys, gateway.cli, gateway.supervisor; print(sorted({'torch', 'transformers', 'faiss', 'onnxruntime'} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def test_one_worker_is_the_default_and_the_count_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().workers == 1
    monkeypatch.setenv("KVGATE_WORKERS", "4")
    assert Settings().workers == 4
    monkeypatch.setenv("KVGATE_WORKERS", "0")
    with pytest.raises(ValidationError):
        Settings()


def test_each_worker_gets_its_share_of_the_inference_cores() -> None:
    settings = Settings(upstream_url="http://upstream:8080/v1")
    cores = settings.threads_for_inference()
    assert settings.threads_for_inference(workers=2) == max(1, cores // 2)
    assert settings.threads_for_inference(workers=cores * 4) == 1


def test_a_port_in_use_fails_at_once_with_a_clear_message(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "KVGATE_DATA_DIR": str(tmp_path), "KVGATE_UPSTREAM_URL": "http://127.0.0.1:9/v1"}
        started = time.monotonic()
        result = subprocess.run(
            [str(Path(sys.executable).with_name("kvgate")), "serve", "--workers", "2", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 2
    assert "Address already in use" in result.stderr
    assert time.monotonic() - started < 60  # before any child was started
    assert not (tmp_path / "store").exists()
