"""Gateway test builders: an app on an embedded store of its own, with a scripted backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.http.app import create_app
from gateway.runtime.settings import Settings
from tests.gateway.fakes import MODEL, ScriptedBackend

ADMIN_TOKEN = "admin-secret-token"
KEYS = "key-alpha:alpha,key-beta:beta"


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "redis_url": None,
        "api_keys": KEYS,
        "admin_token": ADMIN_TOKEN,
    }
    return Settings(**(values | overrides))


def auth(key: str = "key-alpha") -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def chat(content: str, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


@pytest.fixture
def backend() -> ScriptedBackend:
    return ScriptedBackend()


@pytest.fixture
def client(tmp_path: Path, backend: ScriptedBackend) -> Iterator[TestClient]:
    app = create_app(make_settings(tmp_path), backend_factory=lambda settings: backend)
    with TestClient(app) as test_client:
        yield test_client
