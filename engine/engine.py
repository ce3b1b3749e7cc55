"""The synchronous step loop: schedule → run the model → sample → update sequences → stream text.

One `step()` computes one batch of chunks chosen by the scheduler, samples the next token of every
sequence whose chunk reached its last token, turns new tokens into text incrementally, checks stop
conditions, and frees finished sequences at once. It returns what each touched request produced this
step. The engine is single-threaded: `engine.serving.client` runs it on a thread of its own.

This module knows the model runner, the sampler, the tokenizer's `decode` and the scheduler's API; it
makes no scheduling decisions and keeps no block accounting of its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass, field
from typing import Protocol

from engine.grammar import GrammarCompiler, RequestGrammar
from engine.grammar_masks import MaskFiller
from engine.metrics import EngineMetrics
from engine.model.llama import LlamaModel
from engine.model.native_decode import DecodeKernel
from engine.model.paging import LogitsFor, SequenceChunk
from engine.runner import ModelRunner
from engine.sampler import RequestSampler, SamplingParams, sample_batch
from engine.scheduler import ScheduledChunk, Scheduler, SchedulerConfig
from engine.sequence import FinishReason, Sequence
from engine.stopping import FinishReason as StopReason
from engine.stopping import StopChecker
from engine.weights.loader import LoadedModel
from prefix.hashing import model_key
from prefix.manager import BlockManager, BlockManagerConfig

_DETOKENIZER_CONTEXT = 5  # prompt tokens decoded before the output, so its first token keeps its space


class ContextLengthExceeded(ValueError):
    """The prompt leaves no room for a single output token in the model's context (or the KV pool)."""

    def __init__(self, num_prompt_tokens: int, max_model_len: int) -> None:
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens; "
            f"the prompt has {num_prompt_tokens} tokens, leaving no room for a completion."
        )
        self.num_prompt_tokens = num_prompt_tokens
        self.max_model_len = max_model_len


class Detokenizer(Protocol):
    """The part of a tokenizer the engine uses (transformers tokenizers have it)."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True, slots=True)
class EngineConfig:
    num_blocks: int = 1024
    """KV blocks in the pool: with `block_size`, the tokens all running requests can hold together."""
    block_size: int = 16
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    max_model_len: int | None = None
    """Prompt + output tokens per request; None: the model's context (both capped by the pool)."""
    decode_kernel: DecodeKernel = "auto"
    """Decode steps of an int4 model: `auto` runs them as one native call where it builds, else torch's ops;
    `native` requires it; `torch` never uses it (engine.model.native_decode)."""


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """What one request produced in one step: new text and tokens, and how it ended if it did."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    """Prompt tokens served from the prefix cache (at first admission)."""


@dataclass(slots=True)
class _RequestState:
    sequence: Sequence
    sampler: RequestSampler
    stop_checker: StopChecker
    detokenizer: IncrementalDetokenizer
    grammar: RequestGrammar | None = None
    text: str = ""
    num_sent_chars: int = 0


class LLMEngine:
    """Continuous batching over one model and one KV pool."""

    def __init__(
        self,
        model: LlamaModel,
        tokenizer: Detokenizer,
        config: EngineConfig | None = None,
        model_name: str = "model",
        model_revision: str = "",
        metrics: EngineMetrics | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.eos_token_ids = model.config.eos_token_ids
        self.runner = ModelRunner(
            model, self.config.num_blocks, self.config.block_size, self.config.decode_kernel
        )
        manager = BlockManager(BlockManagerConfig(self.config.num_blocks, self.config.block_size))
        # KV computed by differently stored weights differs: the storage is part of the blocks' identity.
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        stored = dtype if model.weights_format == "fp32" else model.weights_format
        identity = model_key(model_name, model_revision, stored)
        self.scheduler = Scheduler(self.config.scheduler, manager, identity)
        self.metrics = metrics or EngineMetrics()
        model_context = self.config.max_model_len or model.config.max_position_embeddings
        self.max_model_len = min(model_context, self.config.num_blocks * self.config.block_size)
        vocab_size = self.runner.config.vocab_size
        self.grammars = GrammarCompiler(tokenizer, vocab_size)  # structured outputs (engine.grammar)
        self._masks = MaskFiller(vocab_size)
        self._requests: dict[str, _RequestState] = {}

    # Public API ---------------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: SequenceOf[int],
        sampling: SamplingParams,
        cache_salt: str | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request. Raises `ContextLengthExceeded` (or ValueError) before scheduling anything."""
        self.check_prompt(prompt_token_ids)
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        grammar = self.grammars.matcher(sampling.grammar) if sampling.grammar is not None else None
        sequence = Sequence(
            request_id,
            list(prompt_token_ids),
            sampling,
            cache_salt=cache_salt,
            priority=priority,
            max_total_tokens=self.max_model_len,
            arrival_time=time.monotonic() if arrival_time is None else arrival_time,
        )
        self.scheduler.add(sequence)
        self._requests[request_id] = _RequestState(
            sequence,
            RequestSampler(sampling),
            StopChecker(sampling, self.eos_token_ids),
            IncrementalDetokenizer(self.tokenizer, sequence.prompt_token_ids),
            grammar,
        )

    def check_prompt(self, prompt_token_ids: SequenceOf[int]) -> None:
        """Raise if a prompt can never be served: empty, unknown token ids, or too long for the context."""
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_token_ids) >= self.max_model_len:
            raise ContextLengthExceeded(len(prompt_token_ids), self.max_model_len)
        vocab_size = self.runner.config.vocab_size
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab_size:
            raise ValueError(f"prompt token ids must be in [0, {vocab_size})")

    def abort(self, request_id: str) -> RequestOutput | None:
        """Finish a request now, freeing its blocks; None if it is unknown or already finished."""
        state = self._requests.get(request_id)
        if state is None:
            return None
        return self._finish(state, "abort", "")

    def step(self) -> list[RequestOutput]:
        """Run one scheduled batch; returns the outputs of requests that sampled a token."""
        scheduled = self.scheduler.schedule()
        outputs: list[RequestOutput] = []
        if scheduled.chunks:
            sampling = [
                self._requests[chunk.sequence.request_id] for chunk in scheduled.chunks if chunk.samples
            ]
            masks = self._masks.start([state.grammar for state in sampling])  # filled during the forward
            logits = self.runner.execute([_model_chunk(chunk) for chunk in scheduled.chunks])
            self.scheduler.advance(scheduled)
            if masks is not None:
                masks.apply(logits)
            token_ids = sample_batch(logits, [state.sampler for state in sampling])
            now = time.monotonic()
            outputs = [
                self._append_token(state, token_id, now)
                for state, token_id in zip(sampling, token_ids, strict=True)
            ]
        self._record_step()
        return outputs

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def generate(self, prompts: SequenceOf[SequenceOf[int]], sampling: SamplingParams) -> list[list[int]]:
        """Run prompts to completion together; their output token ids, in order (for tests and benches)."""
        ids = [f"generate-{id(prompts)}-{index}" for index in range(len(prompts))]
        for request_id, prompt in zip(ids, prompts, strict=True):
            self.add_request(request_id, prompt, sampling)
        results: dict[str, list[int]] = {request_id: [] for request_id in ids}
        while any(request_id in self._requests for request_id in ids):
            for output in self.step():
                if output.request_id in results:
                    results[output.request_id].extend(output.token_ids)
        return [results[request_id] for request_id in ids]

    # Helpers ------------------------------------------------------------------------------------

    def _append_token(self, state: _RequestState, token_id: int, now: float) -> RequestOutput:
        sequence = state.sequence
        previous = sequence.last_token_time
        sequence.append_output_token(token_id, now)
        if previous is None:
            self.metrics.record_token(now - sequence.arrival_time, None)
        else:
            self.metrics.record_token(None, now - previous)
        new_text = state.detokenizer.add(token_id)
        state.text += new_text
        finish = state.stop_checker.check(sequence.output_token_ids, state.text, len(new_text))
        grammar_may_end = finish is None or finish.reason is StopReason.LENGTH
        if grammar_may_end and state.grammar is not None and state.grammar.advance(token_id):
            # The grammar is complete (a whole JSON value): a structured answer ends here, even on its last
            # allowed token (then it is whole, not cut by max_tokens).
            state.text += state.detokenizer.flush()
            return self._finish(state, "stop", state.text[state.num_sent_chars :], [token_id])
        if finish is not None and finish.reason is StopReason.STOP:
            # A stop string ends the text before it; a stop token's own text is left out too.
            end = len(state.text) - len(new_text) if finish.text_end is None else finish.text_end
            return self._finish(state, "stop", state.text[state.num_sent_chars : end], [token_id])
        if finish is not None or sequence.reached_length_limit():
            state.text += state.detokenizer.flush()
            return self._finish(state, "length", state.text[state.num_sent_chars :], [token_id])
        visible = len(state.text) - state.stop_checker.num_held_back_chars(state.text)
        delta = state.text[state.num_sent_chars : visible]
        state.num_sent_chars = max(state.num_sent_chars, visible)
        return self._output(sequence, delta, [token_id], None)

    def _finish(
        self, state: _RequestState, reason: FinishReason, text: str, token_ids: list[int] | None = None
    ) -> RequestOutput:
        sequence = state.sequence
        self.scheduler.finish(sequence, reason)
        del self._requests[sequence.request_id]
        self.metrics.record_finished(reason, sequence.num_prompt_tokens)
        self._record_step()  # an abort between steps frees blocks too: keep the gauges true
        return self._output(sequence, text, token_ids or [], reason)

    def _output(
        self, sequence: Sequence, text: str, token_ids: list[int], reason: FinishReason | None
    ) -> RequestOutput:
        return RequestOutput(
            sequence.request_id,
            text,
            token_ids,
            reason,
            prompt_tokens=sequence.num_prompt_tokens,
            completion_tokens=sequence.num_output_tokens,
            cached_tokens=sequence.num_cached_prompt_tokens or 0,
        )

    def _record_step(self) -> None:
        stats = self.scheduler.stats()
        self.metrics.record_step(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=stats.usage,
            prefix_cache_queries=stats.prefix_cache_queries,
            prefix_cache_hits=stats.prefix_cache_hits,
            num_preemptions=self.scheduler.num_preemptions,
        )


def _model_chunk(chunk: ScheduledChunk) -> SequenceChunk:
    logits = LogitsFor.LAST if chunk.samples else LogitsFor.NONE
    return SequenceChunk(chunk.token_ids, chunk.start, chunk.block_table, logits)


class IncrementalDetokenizer:
    """One request's output tokens to text deltas, decoding only a short window each token.

    A token can end in the middle of a UTF-8 character (byte-level BPE) or change how the previous token
    reads (SentencePiece spaces), so text is released only once the window decodes cleanly."""

    def __init__(self, tokenizer: Detokenizer, prompt_token_ids: list[int]) -> None:
        self._tokenizer = tokenizer
        self._token_ids = list(prompt_token_ids[-_DETOKENIZER_CONTEXT:])
        self._prefix_offset = 0
        self._read_offset = len(self._token_ids)

    def add(self, token_id: int) -> str:
        """Append a token; returns the text it completes ("" while a character is still partial)."""
        self._token_ids.append(token_id)
        prefix_text, full_text = self._decode_window()
        if len(full_text) <= len(prefix_text) or full_text.endswith("\ufffd"):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._token_ids)
        return full_text[len(prefix_text) :]

    def flush(self) -> str:
        """Whatever text is still held back (at the end of a request)."""
        prefix_text, full_text = self._decode_window()
        self._prefix_offset = self._read_offset = len(self._token_ids)
        return full_text[len(prefix_text) :]

    def _decode_window(self) -> tuple[str, str]:
        decode = self._tokenizer.decode
        window = self._token_ids[self._prefix_offset :]
        prefix = self._token_ids[self._prefix_offset : self._read_offset]
        return decode(prefix, skip_special_tokens=True), decode(window, skip_special_tokens=True)


def build_engine(loaded: LoadedModel, model_name: str, config: EngineConfig | None = None) -> LLMEngine:
    """An engine over a loaded model and its tokenizer; the weights' folder names the cache namespace."""
    return LLMEngine(
        loaded.model, loaded.tokenizer, config, model_name=model_name, model_revision=str(loaded.folder)
    )
