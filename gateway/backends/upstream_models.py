"""Which model names reverse-proxy mode answers to.

    KVGATE_UPSTREAM_MODELS given  ->  allow-list: exactly those names, nothing else
    not given                     ->  discovered: what the upstream's `GET /models` lists, refreshed in the
                                      background (a failed refresh keeps the last list, logged once)
                                  ->  pass-through: while the upstream has not listed any (it cannot, or it
                                      has not answered yet), every name goes upstream, whose own error
                                      reaches the client

This module knows the upstream's model list and nothing of requests or the cache.
"""

from __future__ import annotations

import asyncio
import enum
import logging

import httpx

from gateway.runtime.background import cancel_and_wait

logger = logging.getLogger("kvgate.upstream")

LIST_TIMEOUT_S = 5.0
"""A model list is small: an upstream that takes longer is treated as one that cannot list (for now)."""


class ModelsMode(enum.Enum):
    ALLOW_LIST = "allow-list"
    DISCOVERED = "discovered"
    PASS_THROUGH = "pass-through"


class UpstreamModels:
    """The model names of one upstream: a fixed allow-list, or discovered and kept fresh."""

    def __init__(self, allow_list: list[str], refresh_s: float) -> None:
        if refresh_s <= 0:
            raise ValueError("refresh_s must be > 0")
        self.refresh_s = refresh_s
        self._fixed = bool(allow_list)
        self._names: list[str] | None = list(allow_list) if allow_list else None
        self._failing = False
        self._task: asyncio.Task[None] | None = None

    @property
    def mode(self) -> ModelsMode:
        if self._fixed:
            return ModelsMode.ALLOW_LIST
        return ModelsMode.DISCOVERED if self._names is not None else ModelsMode.PASS_THROUGH

    def names(self) -> list[str]:
        """What `GET /v1/models` shows: the allow-list or the last discovered list (empty while unknown)."""
        return list(self._names or ())

    def serves(self, model: str) -> bool:
        return self._names is None or model in self._names

    async def start(self, client: httpx.AsyncClient) -> None:
        """Discover once now (so the first request knows the list), then keep refreshing in the background."""
        if self._fixed or self._task is not None:
            return
        await self.refresh(client)
        self._task = asyncio.create_task(self._refresh_forever(client), name="upstream-models")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def refresh(self, client: httpx.AsyncClient) -> None:
        """Read `GET /models`; on any failure keep the last list and log once until it works again."""
        try:
            response = await client.get("models", timeout=LIST_TIMEOUT_S)
            response.raise_for_status()
            names = _model_ids(response.json())
        except (httpx.HTTPError, ValueError) as error:
            if not self._failing:
                self._failing = True
                kept = (
                    f"keeping the last {len(self._names)}"
                    if self._names is not None
                    else "passing any through"
                )
                logger.warning("the upstream's model list could not be read (%s); %s", _reason(error), kept)
            return
        listed = names or None  # an upstream that lists nothing is one that cannot list: pass through
        if self._failing or listed != self._names:
            logger.info("upstream models: %s", ", ".join(names) or "none listed, passing any through")
        self._failing = False
        self._names = listed

    async def _refresh_forever(self, client: httpx.AsyncClient) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh(client)


def _model_ids(body: object) -> list[str]:
    """The ids of an OpenAI model list, `{"object": "list", "data": [{"id": ...}, ...]}`."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise ValueError("not an OpenAI model list")
    return [str(card["id"]) for card in data if isinstance(card, dict) and card.get("id")]


def _reason(error: Exception) -> str:
    if isinstance(error, httpx.HTTPStatusError):
        return f"HTTP {error.response.status_code}"
    return str(error) or type(error).__name__
