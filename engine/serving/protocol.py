"""`EngineClient`: the engine as its users see it, in this process or behind the engine process's socket.

`AsyncEngineClient` (the step loop on a thread of this process) and `RemoteEngineClient` (one connection to
the engine process of `kvgate serve --workers N`) both satisfy it, so the gateway holds one `EngineClient`
and never asks which it has; `build_engine` makes either. Torch-free: naming the protocol loads no model code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from engine.metrics import EngineStats
    from engine.sampler import SamplingParams
    from engine.serving.events import EngineEvent


@runtime_checkable
class EngineClient(Protocol):
    """Streams completions of token ids; tokenizes chats and prompts with the model's own tokenizer."""

    @property
    def model_name(self) -> str: ...

    @property
    def max_model_len(self) -> int:
        """Prompt + completion tokens one request may hold."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The model folder's transformers tokenizer (its length is the vocabulary's)."""
        ...

    @property
    def info(self) -> Mapping[str, Any]:
        """What the engine says about itself: `weights` (`WeightsChoice.describe()`), `folder`."""
        ...

    @property
    def connected(self) -> bool:
        """Can a request reach the engine now? (The engine process may be restarting.)"""
        ...

    async def connect(self, timeout_s: float) -> None:
        """Reach the engine, retrying until `timeout_s`; nothing to do in process."""
        ...

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Prompt token ids of a chat, with the model's chat template and the assistant turn opened."""
        ...

    def encode_prompt(self, text: str) -> list[int]:
        """Prompt token ids of plain text (legacy completions)."""
        ...

    def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        sampling: SamplingParams | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> AsyncIterator[EngineEvent]:
        """`TextDelta`s, then one `Finished`; raises `ContextLengthExceeded`, `ValueError`, `EngineStopped`.
        A consumer that stops iterating aborts the request."""
        ...

    async def abort(self, request_id: str) -> None:
        """Cancel a request; returns once its blocks are free. A no-op for an unknown or finished one."""
        ...

    @property
    def metrics(self) -> EngineStats:
        """The engine's metrics as last read (`refresh_metrics`)."""
        ...

    async def refresh_metrics(self) -> EngineStats:
        """Read the engine's metrics now (before a scrape)."""
        ...

    async def shutdown(self) -> None: ...
