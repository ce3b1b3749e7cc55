from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.runtime.settings import Settings


def test_reads_prefixed_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVGATE_PORT", "9123")
    monkeypatch.setenv("KVGATE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("KVGATE_REDIS_URL", "redis://:secret@127.0.0.1:6379/2")

    settings = Settings()

    assert settings.port == 9123
    assert settings.store_dir == tmp_path / "store"
    assert settings.redis_url is not None and settings.redis_url.scheme == "redis"


@pytest.mark.parametrize(
    ("field", "value"),
    [("port", "0"), ("port", "70000"), ("redis_url", "http://example.com"), ("log_level", "loud")],
)
def test_refuses_unsafe_values(monkeypatch: pytest.MonkeyPatch, field: str, value: str) -> None:
    monkeypatch.setenv(f"KVGATE_{field.upper()}", value)
    with pytest.raises(ValidationError):
        Settings()


def test_defaults_need_no_external_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVGATE_REDIS_URL", raising=False)
    assert Settings().redis_url is None
