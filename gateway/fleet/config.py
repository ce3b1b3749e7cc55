"""What the fleet is made of, read from the settings: pools of members, each member an upstream URL.

    KVGATE_UPSTREAM_URL=http://a:8000/v1               one URL: no fleet (today's reverse proxy, unchanged)
    KVGATE_UPSTREAM_URL=http://a/v1,http://b/v1        one pool; each member's `GET /models` says what it serves
    KVGATE_UPSTREAM_URL=dns+http://svc:8000/v1         one pool; every address `svc` resolves to is a member
    KVGATE_UPSTREAMS_FILE=fleet.yaml                   a pool per `model_name`, in LiteLLM's `model_list` shape

The file is LiteLLM's shape so that a team moving from LiteLLM's proxy keeps its file: `model_name` (what
clients send), `litellm_params.model` (what the server knows; a provider prefix such as `openai/` or
`hosted_vllm/` is dropped), `litellm_params.api_base` and `api_key` (`os.environ/NAME` reads a variable),
`litellm_params.weight` or `weight`. kvgate adds `canary: true` (the member takes the canary side of the
pool's sticky split, canary.py), `shadow: true` (it gets a copy of the traffic, compared, never served),
`routing` (this pool's policy) and `router_settings.routing_strategy` (every pool's). Other fields of
LiteLLM's (rpm, tpm, model_info, ...) are ignored.

This module knows the shapes and refuses what cannot work (a pool with no serving member, a weight <= 0,
an api_base that is not http(s)); it starts nothing and resolves no name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

from gateway.runtime.settings import Settings

Routing = Literal["prefix", "least-loaded", "round-robin"]
ROUTINGS: tuple[Routing, ...] = ("prefix", "least-loaded", "round-robin")
# LiteLLM's router strategies that mean one of ours.
ROUTING_ALIASES: dict[str, Routing] = {"least-busy": "least-loaded", "simple-shuffle": "round-robin"}
# LiteLLM's prefixes for OpenAI-compatible servers: the server itself knows the model without them.
PROVIDER_PREFIXES = (
    "openai/",
    "hosted_vllm/",
    "vllm/",
    "sglang/",
    "llamacpp/",
    "custom_openai/",
    "openai_like/",
)
DISCOVERED = "dns+"
URL_POOL = "default"
ENV_PREFIX = "os.environ/"


class FleetConfigError(ValueError):
    """The upstreams file (or the URL list) describes no fleet that can work; the message says where."""


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """One configured backend (a `dns+` one stands for every address its name resolves to)."""

    api_base: str
    model: str | None = None
    """The name the server knows (None: the client's, as sent)."""
    api_key: str | None = None
    weight: float = 1.0
    canary: bool = False
    shadow: bool = False

    @property
    def discovered(self) -> bool:
        return self.api_base.startswith(DISCOVERED)

    @property
    def identity(self) -> tuple[str, str | None, str | None, bool]:
        """What makes two specs the same backend across a reload (weights and sides may change)."""
        return (self.api_base, self.model, self.api_key, self.shadow)


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    """The model name clients send (a file's `model_name`), or `default` for the URL list."""
    models: tuple[str, ...] | None
    """What the pool answers to: its `model_name`; None for the URL list (what each member lists)."""
    routing: Routing
    members: tuple[MemberSpec, ...]


@dataclass(frozen=True, slots=True)
class FleetConfig:
    pools: tuple[PoolSpec, ...]
    source: str
    """Where it came from (`KVGATE_UPSTREAM_URL`, or the file's path), for logs and `/healthz`."""


def fleet_config(settings: Settings) -> FleetConfig | None:
    """The fleet the settings describe; None for one plain URL or none (the single upstream, or the engine)."""
    if settings.upstreams_file is not None:
        return read_upstreams_file(settings.upstreams_file, settings.routing)
    urls = settings.upstream_urls
    if len(urls) < 2 and not any(url.startswith(DISCOVERED) for url in urls):
        return None
    key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
    allowed = tuple(name.strip() for name in settings.upstream_models.split(",") if name.strip())
    members = tuple(MemberSpec(api_base=url, api_key=key) for url in urls)
    pool = PoolSpec(URL_POOL, allowed or None, settings.routing, members)
    return FleetConfig((pool,), "KVGATE_UPSTREAM_URL")


def read_upstreams_file(path: Path, default_routing: Routing) -> FleetConfig:
    """Parse the YAML model list at `path` into pools, one per `model_name`, in the file's order."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise FleetConfigError(f"{path}: cannot be read as YAML ({error})") from error
    return parse_upstreams(document, str(path), default_routing)


def parse_upstreams(document: Any, source: str, default_routing: Routing) -> FleetConfig:
    """The pools a parsed upstreams file describes (split from reading, so a test can hand a dict)."""
    if not isinstance(document, dict) or not isinstance(document.get("model_list"), list):
        raise FleetConfigError(f"{source}: expected a mapping with a `model_list` list")
    strategy = (document.get("router_settings") or {}).get("routing_strategy")
    routing = (
        _routing(strategy, f"{source}: router_settings.routing_strategy") if strategy else default_routing
    )
    grouped: dict[str, list[tuple[MemberSpec, Routing | None]]] = {}
    for index, entry in enumerate(document["model_list"]):
        where = f"{source}: model_list[{index}]"
        name, member, own_routing = _entry(entry, where)
        grouped.setdefault(name, []).append((member, own_routing))
    if not grouped:
        raise FleetConfigError(f"{source}: model_list is empty")
    pools = []
    for name, entries in grouped.items():
        chosen = {own for _, own in entries if own is not None}
        if len(chosen) > 1:
            raise FleetConfigError(
                f"{source}: the entries of {name!r} name different routings {sorted(chosen)}"
            )
        members = tuple(member for member, _ in entries)
        if all(member.shadow for member in members):
            raise FleetConfigError(f"{source}: {name!r} has only shadow members: nothing would answer")
        pools.append(PoolSpec(name, (name,), chosen.pop() if chosen else routing, members))
    return FleetConfig(tuple(pools), source)


def upstream_model(name: str | None) -> str | None:
    """`litellm_params.model` as the server knows it: without a LiteLLM provider prefix."""
    if name is None:
        return None
    for prefix in PROVIDER_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _entry(entry: Any, where: str) -> tuple[str, MemberSpec, Routing | None]:
    if not isinstance(entry, dict) or not isinstance(entry.get("model_name"), str) or not entry["model_name"]:
        raise FleetConfigError(f"{where}: needs a `model_name`")
    params = entry.get("litellm_params")
    if not isinstance(params, dict):
        raise FleetConfigError(f"{where}: needs `litellm_params` with an `api_base`")
    api_base = params.get("api_base")
    if not isinstance(api_base, str) or urlsplit(api_base.removeprefix(DISCOVERED)).scheme not in (
        "http",
        "https",
    ):
        raise FleetConfigError(f"{where}: litellm_params.api_base must be an http(s) URL (or dns+http://...)")
    weight = entry.get("weight", params.get("weight", 1))
    if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
        raise FleetConfigError(f"{where}: weight must be a number above 0")
    model = params.get("model")
    member = MemberSpec(
        api_base=api_base.rstrip("/"),
        model=upstream_model(str(model)) if model else None,
        api_key=_secret(params.get("api_key"), where),
        weight=float(weight),
        canary=_flag(entry, "canary", where),
        shadow=_flag(entry, "shadow", where),
    )
    routing = entry.get("routing")
    return entry["model_name"], member, _routing(routing, f"{where}: routing") if routing else None


def _routing(value: Any, where: str) -> Routing:
    name = ROUTING_ALIASES.get(str(value), str(value))
    for routing in ROUTINGS:
        if name == routing:
            return routing
    raise FleetConfigError(f"{where}: {value!r} is not one of {', '.join(ROUTINGS)}")


def _flag(entry: dict[str, Any], name: str, where: str) -> bool:
    value = entry.get(name, False)
    if not isinstance(value, bool):
        raise FleetConfigError(f"{where}: {name} must be true or false")
    return value


def _secret(value: Any, where: str) -> str | None:
    """An api_key as written, or read from the environment (LiteLLM's `os.environ/NAME`)."""
    if value is None:
        return None
    text = str(value)
    if not text.startswith(ENV_PREFIX):
        return text
    variable = text[len(ENV_PREFIX) :]
    if variable not in os.environ:
        raise FleetConfigError(f"{where}: api_key names {variable}, which is not set")
    return os.environ[variable]
