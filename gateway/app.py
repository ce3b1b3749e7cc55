"""The FastAPI application factory: services are built in the lifespan and hung on `app.state`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from engine.model_files import resolve_generator
from gateway.routes import health
from gateway.settings import Settings
from gateway.store_runtime import StoreRuntime
from semantic.embedder import SentenceEmbedder
from semantic.embedder_source import resolve_embedder

logger = logging.getLogger("kvgate")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; nothing heavy happens until the lifespan starts."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await asyncio.to_thread(StoreRuntime.open, settings)
        try:
            app.state.store = store
            app.state.embedder = await asyncio.to_thread(
                SentenceEmbedder, resolve_embedder(settings.embedder)
            )
            app.state.generator_source = resolve_generator(settings.generator, settings.model_dir)
            logger.info("kvgate ready: store=%s embedder=%s", store.kind, app.state.embedder.name)
            yield
        finally:
            await store.close()

    app = FastAPI(title="kvgate", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.include_router(health.router)
    return app
