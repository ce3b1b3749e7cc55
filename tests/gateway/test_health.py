import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.http.app import create_app
from gateway.runtime.settings import Settings
from tests.gateway.fakes import ScriptedBackend


def test_healthz_reports_embedded_store_and_default_models(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, redis_url=None)
    with TestClient(create_app(settings, backend_factory=lambda s: ScriptedBackend())) as client:
        body = client.get("/healthz").json()

    assert body["status"] == "ok"
    assert body["embedder"] == {"name": "all-MiniLM-L6-v2", "dimension": 384, "runtime": "onnx"}
    assert body["verifier"]["runtime"] == "onnx"  # onnxruntime is a dependency: the default runs on it
    assert body["multilingual"] == {
        "languages": ["de", "es", "fr", "ja", "ru", "zh"],
        "embedder": {"name": "multilingual-e5-small-q4", "dimension": 384},
        "verifier": {"name": "multilingual-e5-small-verifier", "loaded": False, "runtime": None},
    }
    assert body["semantic_languages"] == ["de", "en", "es", "fr", "ja", "ru", "zh"]
    assert body["generator"]["kind"] == "gguf" and body["generator"]["present"] is True
    assert body["store"]["kind"] == "embedded" and body["store"]["reachable"] is True
    assert body["store"]["url"] == f"unix://{tmp_path / 'store' / 'valkey.sock'}"
    assert not (tmp_path / "store" / "valkey.sock").exists()  # the child stopped with the app


@pytest.mark.redis
def test_healthz_reports_external_store_without_its_password(tmp_path: Path) -> None:
    url = os.environ.get("KVGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    settings = Settings(data_dir=tmp_path, redis_url=url)
    with TestClient(create_app(settings, backend_factory=lambda s: ScriptedBackend())) as client:
        store = client.get("/healthz").json()["store"]
    assert store["kind"] == "external" and store["reachable"] is True
    assert not (tmp_path / "store").exists()
