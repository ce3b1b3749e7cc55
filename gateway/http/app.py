"""The FastAPI application factory: services are built in the lifespan and hung on `app.state`."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from engine import resolve_generator
from gateway.api.errors import install_error_handlers
from gateway.apis.exact_memo import ExactMemo
from gateway.apis.routes import api_routes, passthrough_route
from gateway.backends.protocol import Backend
from gateway.backends.upstream import UpstreamBackend
from gateway.embeddings import EmbeddingsService
from gateway.fail_open import FailOpenCache
from gateway.feedback import FeedbackService
from gateway.fleet.backend import FleetBackend
from gateway.fleet.config import fleet_config
from gateway.fleet.fleet import FleetOptions
from gateway.http.auth import AdminGuard, KeyRing
from gateway.http.body_limit import BodyLimitMiddleware
from gateway.http.gateway_app import GatewayApp
from gateway.http.routes import admin, health, openai
from gateway.http.worker_peers import PeerServer, WorkerPeers, worker_socket
from gateway.observability.feedback_log import FEEDBACK_FILE, FeedbackLog
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.progress import rich_progress
from gateway.observability.served_hits import ServedHits
from gateway.observability.stats import HitStats
from gateway.observability.tracing import Tracing
from gateway.runtime.admin_token import ensure_admin_token
from gateway.runtime.allocator import HeapTrimmer, limit_arenas
from gateway.runtime.background import cancel_and_wait
from gateway.runtime.process_plan import ProcessPlan
from gateway.runtime.settings import Settings
from gateway.runtime.store import StoreRuntime
from gateway.service import CompletionService
from gateway.traffic.breaker import BreakerState, CircuitBreaker
from gateway.traffic.ratelimit import RateLimiter
from gateway.traffic.tenant_policy import TenantPolicy
from semantic import (
    CacheConfig,
    HitRule,
    RedisEntryStore,
    SemanticCache,
    SentenceEmbedder,
    load_served_rule,
    multilingual_languages,
    resolve_embedder,
    served_embedder,
)

logger = logging.getLogger("kvgate")

BackendFactory = Callable[[Settings], Backend]
METRICS_REFRESH_S = 1.0


def create_app(
    settings: Settings | None = None,
    backend_factory: BackendFactory | None = None,
    plan: ProcessPlan | None = None,
) -> FastAPI:
    """Build the app; nothing heavy happens until the lifespan starts.

    `backend_factory` replaces the default backend (the upstream in reverse-proxy mode, else the engine).
    `plan` makes this app one worker of `kvgate serve --workers N`: the store and the engine process are
    the supervisor's, metrics go to the shared multiprocess directory, `/admin/stats` sums every worker.
    """
    settings = settings or Settings()
    keys = KeyRing.from_settings(
        settings.api_keys.get_secret_value() if settings.api_keys else None, settings.api_keys_file
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if keys.open:
            logger.warning("no API keys configured: kvgate is open to anyone as the single tenant 'default'")
        set_torch_threads(settings)
        limit_arenas()
        trimmer = HeapTrimmer(settings.malloc_trim_interval_s) if settings.malloc_trim_interval_s else None
        if trimmer is not None:
            trimmer.start()
        if plan is not None and plan.store_url is not None:
            store = StoreRuntime.attach(plan.store_url)  # the supervisor keeps it running
        else:
            store = await asyncio.to_thread(StoreRuntime.open, settings)
        store.start_watching()
        breakers: dict[str, CircuitBreaker] = app.state.breakers
        upstream_backend = partial(
            default_backend,
            upstream_breaker=breakers["upstream"],
            engine_socket=plan.engine_socket if plan is not None else None,
        )
        backend = await asyncio.to_thread(backend_factory or upstream_backend, settings)
        app.state.limiter = RateLimiter(
            TenantPolicy(
                rpm=settings.rate_limit_rpm,
                tpm=settings.rate_limit_tpm,
                priority=settings.default_priority,
                overrides=settings.tenant_limits,
            ),
            store.client,
            app.state.metrics,
            count_hits=settings.rate_limit_count_hits,
            default_max_tokens=settings.default_max_tokens,
            breaker=breakers["store"],
        )
        cache: SemanticCache | None = None
        peer_server: PeerServer | None = None
        refresher: asyncio.Task[None] | None = None
        start_backend = getattr(backend, "start", None)  # reverse-proxy mode learns the upstream's models
        if start_backend is not None:
            await start_backend()
        register_metrics = getattr(backend, "register_metrics", None)
        if register_metrics is not None:
            register_metrics(app.state.metrics.scrape)
        try:
            threads = settings.threads_for_inference(plan.workers if plan is not None else 1)
            english_embedder = await asyncio.to_thread(
                SentenceEmbedder,
                resolve_embedder(settings.embedder),
                settings.inference_runtime,
                settings.export_dir,
                threads,
            )
            rule = await asyncio.to_thread(load_rule, settings, plan.workers if plan is not None else 1)
            # Prompts in the languages the multilingual rule judges are embedded by multilingual-e5, into
            # scopes of their own (semantic/language_routing.py).
            embedder = await asyncio.to_thread(
                served_embedder, english_embedder, multilingual_languages(rule), threads
            )
            cache = SemanticCache(
                RedisEntryStore(store.client),
                embedder,
                rule,
                CacheConfig(default_ttl_s=settings.cache_ttl_s),
            )
            with rich_progress("rebuilding the semantic index from the store") as progress:
                indexed = await cache.start(progress)
            sync = cache.sync
            app.state.metrics.watch_index(lambda: len(sync.index), lambda: sync.rebuilds_running)
            logger.info("semantic index rebuilt from the store: %d vectors", indexed)
            app.state.store = store
            app.state.embedder = (
                english_embedder  # /healthz describes it; multilingual prompts: semantic_languages
            )
            app.state.backend = backend
            app.state.generator_source = resolve_generator(settings.generator, settings.model_dir)
            served_hits = ServedHits(store.client, settings.feedback_window_s)
            fail_open = FailOpenCache(
                cache,
                app.state.metrics,
                breakers["store"],
                served_hits,
                settings.store_error_log_interval_s,
            )
            app.state.service = CompletionService(
                fail_open,
                backend,
                HitStats(),
                scope_secret=settings.scope_secret.get_secret_value().encode(),
                max_pending=settings.max_pending,
                store_truncated=settings.store_truncated,
                max_stored_answer_bytes=settings.max_stored_answer_bytes,
                log_prompts=settings.log_prompts,
                shadow_mode=settings.shadow_mode,
            )
            if settings.exact_memo_revalidate_s > 0:
                app.state.exact_memo = ExactMemo(settings.exact_memo_revalidate_s)
            app.state.feedback = FeedbackService(
                cache, served_hits, FeedbackLog(settings.data_dir / FEEDBACK_FILE), app.state.service.stats
            )
            app.state.embeddings = EmbeddingsService(app.state.service)
            weights = getattr(backend, "weights", None)  # the engine's weights format, and why
            logger.info(
                "kvgate ready: store=%s backend=%s embedder=%s%s",
                store.kind,
                backend.name,
                embedder.name,
                f" engine_weights={weights.weights} ({weights.reason})" if weights is not None else "",
            )
            if plan is not None:
                peer_server = PeerServer(worker_socket(plan.run_dir, plan.index), app.state.service)
                app.state.peers = WorkerPeers(plan.run_dir, plan.workers)
                app.state.worker = plan.index
                refresher = asyncio.create_task(_refresh_metrics(app.state.metrics), name="metrics-refresh")
            freeze_startup_objects()
            if peer_server is not None:
                await peer_server.start()  # last: the supervisor reads it as "this worker is ready"
            yield
        finally:
            gc.unfreeze()  # what this app built can be collected once it stops (tests start many apps)
            if peer_server is not None:
                await peer_server.close()
            await cancel_and_wait(refresher)
            if cache is not None:
                await cache.stop()
            close = getattr(backend, "close", None)
            if close is not None:
                await close()
            await store.close()
            if trimmer is not None:
                await trimmer.stop()
            app.state.tracing.shutdown()

    # FastAPI's own OpenTelemetry hooks are off: kvgate traces with a provider of its own (gateway/observability/tracing.py),
    # and the hooks looked the global provider up in os.environ on every request (8% of an exact hit's CPU).
    telemetry: Any = {"tracing": False, "metrics": False, "logs": False}  # a TypedDict in FastAPI >= 0.16x
    app = GatewayApp(title="kvgate", version="0.1.0", lifespan=lifespan, telemetry=telemetry)
    app.state.settings = settings
    app.state.metrics = GatewayMetrics(multiprocess_dir=plan.metrics_dir if plan is not None else None)
    app.state.peers = None
    app.state.worker = None
    app.state.exact_memo = None
    app.state.breakers = make_breakers(settings, app.state.metrics)
    app.state.tracing = Tracing.from_endpoint(settings.otlp_endpoint)
    app.state.keys = keys
    configured = settings.admin_token.get_secret_value() if settings.admin_token else None
    app.state.admin_guard = AdminGuard(ensure_admin_token(configured, settings.data_dir))
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.include_router(openai.router)
    app.include_router(health.router)
    app.include_router(admin.router)
    app.router.routes[0:0] = api_routes()  # matched before the routers (gateway/apis/pipeline.py)
    if settings.reverse_proxy:
        app.router.routes.append(passthrough_route())  # last: only what no other route takes
    return app


def freeze_startup_objects() -> None:
    """Move everything built at start-up (models, tokenizers, modules) out of the garbage collector's sight.

    Requests allocate fast enough to trigger full collections, and each full collection walked the millions
    of objects torch and transformers leave behind: 200 ms pauses, the p99 of exact hits under load.
    Frozen objects are never collected, which is right for what lives as long as the process.
    """
    gc.collect()
    gc.freeze()


async def _refresh_metrics(metrics: GatewayMetrics) -> None:
    """A worker's index gauges, written to its metrics files every second for scrapes on other workers."""
    while True:
        metrics.refresh()
        await asyncio.sleep(METRICS_REFRESH_S)


def set_torch_threads(settings: Settings) -> None:
    """torch's threads, where this process runs torch: the in-process engine, or a model asked to run on
    torch. Reverse-proxy mode on ONNX Runtime never imports torch (about 180 MB of a process, issue 46)."""
    engine_mode = settings.upstream_url is None and fleet_config(settings) is None
    if engine_mode or settings.inference_runtime == "torch" or "torch" in sys.modules:
        import torch

        torch.set_num_threads(settings.torch_threads)


def default_backend(
    settings: Settings,
    upstream_breaker: CircuitBreaker | None = None,
    engine_socket: Path | None = None,
) -> Backend:
    fleet = fleet_config(settings)  # several upstreams, a `dns+` name or the upstreams file (gateway/fleet/)
    if fleet is not None:
        return FleetBackend(fleet, FleetOptions.from_settings(settings))
    if settings.upstream_url is not None:
        models = [name.strip() for name in settings.upstream_models.split(",") if name.strip()]
        api_key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
        return UpstreamBackend(
            str(settings.upstream_url),
            api_key,
            models,
            settings.upstream_timeout_s,
            breaker=upstream_breaker,
            connect_retries=settings.upstream_connect_retries,
            connect_timeout_s=settings.upstream_connect_timeout_s,
            max_connections=settings.upstream_max_connections,
            keepalive_s=settings.upstream_keepalive_s,
            models_refresh_s=settings.upstream_models_refresh_s,
        )
    from gateway.backends.engine import EngineBackend  # torch and the model load only in this mode

    if engine_socket is not None:
        return EngineBackend.remote(settings, engine_socket)  # the engine process of --workers N
    return EngineBackend.load(settings)


def make_breakers(settings: Settings, metrics: GatewayMetrics) -> dict[str, CircuitBreaker]:
    """One breaker per dependency that can fail: the upstream (reverse-proxy mode) and the Redis store."""

    def export(name: str, state: BreakerState) -> None:
        metrics.breaker_state.labels(name).set(state.gauge_value)

    breakers = {
        name: CircuitBreaker(
            name,
            failure_threshold=settings.breaker_failures,
            cooldown_s=settings.breaker_cooldown_s,
            failure_rate=settings.breaker_failure_rate,
            window_s=settings.breaker_window_s,
            on_change=export,
        )
        for name in ("upstream", "store")
    }
    for name in breakers:
        export(name, BreakerState.CLOSED)
    return breakers


def load_rule(settings: Settings, workers: int = 1) -> HitRule:
    """The served rule at the configured target: the calibrated English rule (a `kvgate calibrate` file in
    the data dir wins) and the multilingual rule for the languages it was calibrated on."""
    return load_served_rule(
        settings.data_dir,
        settings.target_false_hit_rate,
        runtime=settings.inference_runtime,
        export_dir=settings.export_dir,
        threads=settings.threads_for_inference(workers),
    )
