"""A client that walks away from a stream: it reads until the first token, then disconnects."""

from __future__ import annotations

from typing import Any

import httpx


def leave_after_first_token(base_url: str, body: dict[str, Any]) -> None:
    """POST a streamed completion and close the connection as soon as a content delta arrives."""
    with (
        httpx.Client(base_url=base_url, timeout=60) as http,
        http.stream("POST", "/v1/chat/completions", json=body | {"stream": True}) as response,
    ):
        for line in response.iter_lines():
            if '"content":' in line and '"role"' not in line:
                return
