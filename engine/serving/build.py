"""`build_engine`: an `EngineClient` from a config, the engine in this process or the engine process's socket.

In process it resolves the generator (converting a GGUF once), chooses how to store the weights on this CPU
(`choose_weights`), loads the model and starts the step loop on its thread; `info` then says which weights
and which model folder, as the engine process tells its workers. Remotely it only makes the client: it
connects in its caller's event loop (`await client.connect(...)`), and learns the model from the engine.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import overload

from engine.engine_config import EngineConfig
from engine.model.native_decode import DecodeKernel
from engine.scheduler import SchedulerConfig
from engine.serving.client import AsyncEngineClient
from engine.serving.remote_client import RemoteEngineClient
from engine.weights.choice import choose_weights
from engine.weights.loader import ensure_hf_folder, load_model, load_tokenizer, read_config, weights_storage
from engine.weights.model_files import resolve_generator

logger = logging.getLogger("kvgate.engine")


@dataclass(frozen=True, slots=True)
class LocalEngineConfig:
    """The engine in this process: which model, its weights' format, its KV cache and its batch."""

    generator: str
    """`DEFAULT_GENERATOR_NAME`, a GGUF file, a model folder or a hub name (`resolve_generator`)."""
    model_dir: Path
    """Where the default generator and converted GGUFs live."""
    model_name: str
    """The name clients put in `model`."""
    weights: str
    """`auto` (timed on this CPU, `choose_weights`) or one of `WEIGHTS_FORMATS`."""
    decode: DecodeKernel
    """How an int4 model runs decode steps: `auto`, `native` or `torch` (`engine.model.native_decode`)."""
    kv_cache_tokens: int
    """Tokens the paged KV cache holds, all running requests together."""
    kv_block_size: int
    max_num_seqs: int
    """Sequences the scheduler runs in one step."""

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ValueError("the engine needs a model name")
        if min(self.kv_cache_tokens, self.kv_block_size, self.max_num_seqs) < 1:
            raise ValueError("kv_cache_tokens, kv_block_size and max_num_seqs must be positive")

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            num_blocks=max(1, self.kv_cache_tokens // self.kv_block_size),
            block_size=self.kv_block_size,
            scheduler=SchedulerConfig(max_num_seqs=self.max_num_seqs),
            decode_kernel=self.decode,
        )


@dataclass(frozen=True, slots=True)
class RemoteEngineConfig:
    """The engine process of `kvgate serve --workers N`, at its unix socket."""

    socket_path: Path


@overload
def build_engine(config: LocalEngineConfig) -> AsyncEngineClient: ...


@overload
def build_engine(config: RemoteEngineConfig) -> RemoteEngineClient: ...


def build_engine(config: LocalEngineConfig | RemoteEngineConfig) -> AsyncEngineClient | RemoteEngineClient:
    """A started in-process engine (blocks while the model loads), or a client of the engine process that
    its caller connects."""
    if isinstance(config, RemoteEngineConfig):
        return RemoteEngineClient(config.socket_path, load_tokenizer)
    return _start_local(config)


def _start_local(config: LocalEngineConfig) -> AsyncEngineClient:
    source = resolve_generator(config.generator, config.model_dir)
    model_config = read_config(ensure_hf_folder(source, config.model_dir))
    weights = choose_weights(config.weights, model_config, weights_storage(source), config.decode)
    loaded = load_model(source, config.model_dir, weights=weights.weights)
    client = AsyncEngineClient.from_loaded(loaded, config.model_name, config.engine_config())
    weights = dataclasses.replace(weights, decode=client.engine.runner.decode_kernel)
    logger.info("engine decode steps: %s", weights.decode)
    client.info = {"weights": weights.describe(), "folder": str(loaded.folder)}
    client.start()
    return client
