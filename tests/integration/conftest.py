"""Integration fixtures: the official openai client against the module's `base_url` (a real server)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest


@pytest.fixture
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk
