"""`EngineClient` is what both clients offer: the in-process `AsyncEngineClient` and the engine process's
`RemoteEngineClient` have every member it names and take every call it allows; `build_engine` hands back
the client its config names."""

from __future__ import annotations

import inspect
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import EngineClient, LocalEngineConfig, RemoteEngineConfig, build_engine
from engine.serving.client import AsyncEngineClient
from engine.serving.remote_client import RemoteEngineClient
from tests.engine.serving.test_serving import (  # noqa: F401  (one_torch_thread is an autouse fixture)
    ToyTokenizer,
    make_engine,
    one_torch_thread,
)

CLIENTS = [AsyncEngineClient, RemoteEngineClient]


@pytest.fixture
def socket_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="kvgate-", dir="/tmp"))  # unix socket paths are short
    yield directory / "engine.sock"
    shutil.rmtree(directory, ignore_errors=True)


def protocol_members() -> dict[str, Any]:
    return {name: member for name, member in vars(EngineClient).items() if not name.startswith("_")}


def test_both_clients_are_engine_clients(socket_path: Path) -> None:
    """Every member, properties and attributes included, is there (`runtime_checkable` checks names)."""
    local = AsyncEngineClient(make_engine(), ToyTokenizer())
    remote = RemoteEngineClient(socket_path, lambda folder: ToyTokenizer())
    assert isinstance(local, EngineClient)
    assert isinstance(remote, EngineClient)
    assert not isinstance(object(), EngineClient)


@pytest.mark.parametrize("client_class", CLIENTS, ids=lambda client_class: client_class.__name__)
def test_each_method_takes_every_call_the_protocol_allows(client_class: type) -> None:
    methods = {name: member for name, member in protocol_members().items() if inspect.isfunction(member)}
    assert {"generate", "abort", "connect", "encode_chat", "refresh_metrics", "shutdown"} <= set(methods)
    for name, wanted in methods.items():
        offered = getattr(client_class, name)
        if inspect.iscoroutinefunction(wanted):
            assert inspect.iscoroutinefunction(offered), f"{client_class.__name__}.{name} must be awaited"
        elif name == "generate":
            assert inspect.isasyncgenfunction(offered), f"{client_class.__name__}.generate must stream"
        problems = call_mismatches(inspect.signature(wanted), inspect.signature(offered))
        assert not problems, f"{client_class.__name__}.{name}: {problems}"


def test_build_engine_makes_the_client_its_config_names(socket_path: Path) -> None:
    client = build_engine(RemoteEngineConfig(socket_path))
    assert isinstance(client, RemoteEngineClient) and client.socket_path == socket_path
    assert not client.connected  # its caller connects it, in its own event loop


def test_a_local_engine_config_refuses_what_no_engine_can_run() -> None:
    good: dict[str, Any] = {
        "generator": "smollm2-135m-instruct",
        "model_dir": Path("/nonexistent"),
        "model_name": "m",
        "weights": "auto",
        "decode": "auto",
        "kv_cache_tokens": 64,
        "kv_block_size": 16,
        "max_num_seqs": 4,
    }
    config = LocalEngineConfig(**good).engine_config()
    assert (config.num_blocks, config.block_size, config.scheduler.max_num_seqs) == (4, 16, 4)
    for field, value in (("model_name", ""), ("kv_cache_tokens", 0), ("max_num_seqs", 0)):
        with pytest.raises(ValueError):
            LocalEngineConfig(**{**good, field: value})


def call_mismatches(wanted: inspect.Signature, offered: inspect.Signature) -> list[str]:
    """What of `wanted`'s calls `offered` would not take: a missing or differently passed parameter, a
    default the protocol promises that is missing, or an extra parameter without a default."""
    problems = []
    offered_params = dict(offered.parameters)
    for name, param in wanted.parameters.items():
        if name == "self":
            continue
        other = offered_params.pop(name, None)
        if other is None:
            problems.append(f"no parameter {name!r}")
        elif other.kind != param.kind and not (
            other.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
            and param.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.KEYWORD_ONLY)
        ):
            problems.append(f"{name!r} is {other.kind.description}, not {param.kind.description}")
        elif param.default is not inspect.Parameter.empty and other.default is inspect.Parameter.empty:
            problems.append(f"{name!r} has no default")
    problems += [
        f"extra parameter {name!r} without a default"
        for name, param in offered_params.items()
        if name != "self"
        and param.default is inspect.Parameter.empty
        and param.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    return problems
