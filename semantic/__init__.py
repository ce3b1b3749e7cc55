"""The semantic answer cache: scope, embedder, FAISS index over a Redis store, decision rule."""

# The front door: what the gateway may use of semantic/ (tests/test_import_direction.py holds it to these
# names). Each name is imported from its module on first use (PEP 562), so `import semantic` loads no torch,
# transformers or FAISS: the supervisor and the light commands (`kvgate report`, `models --check`) import it.

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from semantic.cache import CacheConfig, CacheControl, Lookup, LookupKind, SemanticCache
    from semantic.embedding.embedder import SentenceEmbedder
    from semantic.embedding.embedder_source import resolve_embedder
    from semantic.guards.language import language_of
    from semantic.language_routing import served_embedder
    from semantic.rule.language_routed_rule import multilingual_languages
    from semantic.rule.loading import load_rule, load_served_rule
    from semantic.rule.verdict import HitRule
    from semantic.store.changes import RedisClient
    from semantic.store.entries import CacheEntry, RedisEntryStore
    from semantic.store.purge import PurgeSelector
    from semantic.store.scope import RequestScope, build_scope

_EXPORTS: dict[str, tuple[str, ...]] = {
    # the cache, what a request asks of it and what a lookup found
    "semantic.cache": ("CacheConfig", "CacheControl", "Lookup", "LookupKind", "SemanticCache"),
    "semantic.store.scope": ("RequestScope", "build_scope"),
    "semantic.store.entries": ("CacheEntry", "RedisEntryStore"),
    "semantic.store.changes": ("RedisClient",),
    "semantic.store.purge": ("PurgeSelector",),
    # the rule and the embedder the cache is built with
    "semantic.rule.loading": ("load_served_rule", "load_rule"),
    "semantic.rule.language_routed_rule": ("multilingual_languages",),
    "semantic.rule.verdict": ("HitRule",),
    "semantic.guards.language": ("language_of",),
    "semantic.embedding.embedder": ("SentenceEmbedder",),
    "semantic.embedding.embedder_source": ("resolve_embedder",),
    "semantic.language_routing": ("served_embedder",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "CacheConfig",
    "CacheControl",
    "CacheEntry",
    "HitRule",
    "Lookup",
    "LookupKind",
    "PurgeSelector",
    "RedisClient",
    "RedisEntryStore",
    "RequestScope",
    "SemanticCache",
    "SentenceEmbedder",
    "build_scope",
    "language_of",
    "load_rule",
    "load_served_rule",
    "multilingual_languages",
    "resolve_embedder",
    "served_embedder",
]

if not TYPE_CHECKING:  # hidden from mypy, which would otherwise type a misspelt name as Any

    def __getattr__(name: str) -> Any:
        module = _MODULE_OF.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # found once: later reads do not come back here
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
