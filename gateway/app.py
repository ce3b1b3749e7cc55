"""The FastAPI application factory: services are built in the lifespan and hung on `app.state`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI

from engine.model_files import resolve_generator
from gateway.auth import AdminGuard, KeyRing
from gateway.backend import Backend
from gateway.body_limit import BodyLimitMiddleware
from gateway.errors import install_error_handlers
from gateway.metrics import GatewayMetrics
from gateway.routes import admin, health, openai
from gateway.service import CompletionService
from gateway.settings import Settings
from gateway.stats import HitStats
from gateway.store_runtime import StoreRuntime
from gateway.tracing import Tracing
from gateway.upstream import UpstreamBackend
from semantic.cache import CacheConfig, SemanticCache
from semantic.embedder import SentenceEmbedder
from semantic.embedder_source import resolve_embedder
from semantic.index import rich_progress
from semantic.store import RedisEntryStore
from semantic.threshold_rule import CosineThresholdRule
from semantic.verdict import HitRule

logger = logging.getLogger("kvgate")

BackendFactory = Callable[[Settings], Backend]


def create_app(settings: Settings | None = None, backend_factory: BackendFactory | None = None) -> FastAPI:
    """Build the app; nothing heavy happens until the lifespan starts.

    `backend_factory` replaces the default backend (the upstream in reverse-proxy mode, else the engine).
    """
    settings = settings or Settings()
    keys = KeyRing.from_settings(
        settings.api_keys.get_secret_value() if settings.api_keys else None, settings.api_keys_file
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if keys.open:
            logger.warning("no API keys configured: kvgate is open to anyone as the single tenant 'default'")
        torch.set_num_threads(settings.torch_threads)
        store = await asyncio.to_thread(StoreRuntime.open, settings)
        backend = await asyncio.to_thread(backend_factory or default_backend, settings)
        cache: SemanticCache | None = None
        register_metrics = getattr(backend, "register_metrics", None)
        if register_metrics is not None:
            register_metrics(app.state.metrics.registry)
        try:
            embedder = await asyncio.to_thread(SentenceEmbedder, resolve_embedder(settings.embedder))
            cache = SemanticCache(
                RedisEntryStore(store.client),
                embedder,
                load_rule(settings),
                CacheConfig(default_ttl_s=settings.cache_ttl_s),
            )
            with rich_progress("rebuilding the semantic index from the store") as progress:
                indexed = await cache.start(progress)
            logger.info("semantic index rebuilt from the store: %d vectors", indexed)
            app.state.store = store
            app.state.embedder = embedder
            app.state.backend = backend
            app.state.generator_source = resolve_generator(settings.generator, settings.model_dir)
            app.state.service = CompletionService(
                cache,
                backend,
                HitStats(),
                app.state.metrics,
                scope_secret=settings.scope_secret.get_secret_value().encode(),
                max_pending=settings.max_pending,
                store_truncated=settings.store_truncated,
                log_prompts=settings.log_prompts,
                shadow_mode=settings.shadow_mode,
            )
            logger.info(
                "kvgate ready: store=%s backend=%s embedder=%s", store.kind, backend.name, embedder.name
            )
            yield
        finally:
            if cache is not None:
                await cache.stop()
            close = getattr(backend, "close", None)
            if close is not None:
                await close()
            await store.close()
            app.state.tracing.shutdown()

    app = FastAPI(title="kvgate", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics = GatewayMetrics()
    app.state.tracing = Tracing.from_endpoint(settings.otlp_endpoint)
    app.state.keys = keys
    app.state.admin_guard = AdminGuard(
        settings.admin_token.get_secret_value() if settings.admin_token else None
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.include_router(health.router)
    app.include_router(openai.router)
    app.include_router(admin.router)
    return app


def default_backend(settings: Settings) -> Backend:
    if settings.upstream_url is not None:
        models = [name.strip() for name in settings.upstream_models.split(",") if name.strip()]
        api_key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
        return UpstreamBackend(str(settings.upstream_url), api_key, models, settings.upstream_timeout_s)
    from gateway.engine_backend import EngineBackend  # torch and the model load only in this mode

    return EngineBackend.load(settings)


def load_rule(settings: Settings) -> HitRule:
    return CosineThresholdRule(0.9)
