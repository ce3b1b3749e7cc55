"""The in-process generator: Llama-family model over a paged KV cache, scheduler, async client."""

# The front door: what the gateway may use of engine/ (tests/test_import_direction.py holds it to these names).
# Each name is imported from its module on first use (PEP 562), so `import engine` loads no torch: the
# supervisor, `kvgate models` and the worker sockets use the torch-free parts and must stay light.

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.engine_config import ContextLengthExceeded
    from engine.grammar import json_object_spec, json_schema_spec
    from engine.metrics import EngineStats, register_engine_metrics
    from engine.sampler import SamplingParams
    from engine.serving.build import LocalEngineConfig, RemoteEngineConfig, build_engine
    from engine.serving.events import EngineEvent, EngineStopped, Finished, TextDelta
    from engine.serving.ipc import ConnectionClosed, Message, ask_blocking, open_connection, receive, send
    from engine.serving.protocol import EngineClient
    from engine.serving.server import EngineServer
    from engine.weights.choice import WeightsChoice
    from engine.weights.model_files import (
        DEFAULT_GENERATOR_NAME,
        SMOLLM2_135M_INSTRUCT,
        ModelFetchError,
        ensure_packaged_gguf,
        resolve_generator,
    )

_EXPORTS: dict[str, tuple[str, ...]] = {
    "engine.engine_config": ("ContextLengthExceeded",),
    "engine.grammar": ("json_object_spec", "json_schema_spec"),
    "engine.metrics": ("EngineStats", "register_engine_metrics"),
    "engine.sampler": ("SamplingParams",),
    "engine.serving.build": ("LocalEngineConfig", "RemoteEngineConfig", "build_engine"),
    "engine.serving.events": ("EngineEvent", "EngineStopped", "Finished", "TextDelta"),
    "engine.serving.ipc": (
        "ConnectionClosed",
        "Message",
        "ask_blocking",
        "open_connection",
        "receive",
        "send",
    ),
    "engine.serving.protocol": ("EngineClient",),
    "engine.serving.server": ("EngineServer",),
    "engine.weights.choice": ("WeightsChoice",),
    "engine.weights.model_files": (
        "DEFAULT_GENERATOR_NAME",
        "SMOLLM2_135M_INSTRUCT",
        "ModelFetchError",
        "ensure_packaged_gguf",
        "resolve_generator",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "DEFAULT_GENERATOR_NAME",
    "SMOLLM2_135M_INSTRUCT",
    "ConnectionClosed",
    "ContextLengthExceeded",
    "EngineClient",
    "EngineEvent",
    "EngineServer",
    "EngineStats",
    "EngineStopped",
    "Finished",
    "LocalEngineConfig",
    "Message",
    "ModelFetchError",
    "RemoteEngineConfig",
    "SamplingParams",
    "TextDelta",
    "WeightsChoice",
    "ask_blocking",
    "build_engine",
    "ensure_packaged_gguf",
    "json_object_spec",
    "json_schema_spec",
    "open_connection",
    "receive",
    "register_engine_metrics",
    "resolve_generator",
    "send",
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
