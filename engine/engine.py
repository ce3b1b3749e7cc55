"""The synchronous step loop: schedule → run the model → sample → update sequences → stream text.

One `step()` computes one batch of chunks chosen by the scheduler, samples the next token of every
sequence whose chunk reached its last token, turns new tokens into text incrementally, checks stop
conditions, and frees finished sequences at once. It returns what each touched request produced this
step. The engine is single-threaded: `engine.serving.client` runs it on a thread of its own.

A request with `n > 1` choices is one sequence while its prompt is computed (once); at its first sample it
forks into `n` sequences sharing the prompt's KV blocks (`Scheduler.fork`), each with its own sampler
(choice `i` of a seeded request draws from `seed + i`), stop checker and detokenizer. Outputs carry their
choice `index`; the output that finishes the last choice has `last` set. With `logprobs`, each output
carries the log-probabilities of the tokens whose text it releases (`engine.logprobs`).

A constrained request (`sampling.grammar`, structured outputs) holds a grammar matcher per choice: a fork
gets a copy of its parent's, taken before any token, so that step the parent's mask is the children's too.
The mask sets disallowed logits to -inf before the sampler's penalties and bias, which only add finite
amounts, so a disallowed token can never be chosen; logprobs are read from the logits before the mask.

A lone greedy sequence (nothing else running or waiting, no logprobs, penalties, bias or grammar) decodes
up to `EngineConfig.burst_tokens` tokens in one native call, inside the block that holds its next position
(`Scheduler.burst_room`; when it may is `engine/burst.py`'s call); each token is then appended as a single step
would append it, and the scheduler counts the ones whose K/V the call wrote (`Scheduler.computed_ahead`).
What a step hands back, and what it keeps per choice, is `engine/request_output.py`; its sizes,
`engine/engine_config.py`.

This module knows the model runner, the sampler, the tokenizer's `decode` and the scheduler's API; it
makes no scheduling decisions and keeps no block accounting of its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as SequenceOf

import torch

from engine.burst import burst_steps
from engine.detokenizer import Detokenizer, IncrementalDetokenizer
from engine.engine_config import ContextLengthExceeded, EngineConfig
from engine.grammar import GrammarCompiler, RequestGrammar
from engine.grammar_masks import MaskFiller
from engine.logprobs import TokenLogprob, TopLogprobs, top_logprobs
from engine.metrics import EngineMetrics
from engine.model.llama import LlamaModel
from engine.model.paging import LogitsFor, SequenceChunk
from engine.request_output import RequestOutput, RequestState, choice_id, merged, wants_logprobs
from engine.runner import ModelRunner
from engine.sampler import RequestSampler, SamplingParams, sample_batch
from engine.scheduler import ScheduledChunk, Scheduler, SchedulerOutput
from engine.sequence import FinishReason, Sequence
from engine.stopping import FinishReason as StopReason
from engine.stopping import StopChecker
from engine.weights.loader import LoadedModel
from prefix.hashing import model_key
from prefix.manager import BlockManager, BlockManagerConfig


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
        self._requests: dict[str, RequestState] = {}  # by sequence id
        self._choices: dict[str, list[str]] = {}  # request id -> its unfinished sequences' ids
        self._token_texts: dict[int, str] = {}  # one token decoded alone (logprobs' alternatives)

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
        sequence_ids = [choice_id(request_id, index) for index in range(sampling.n)]
        if request_id in self._choices or any(seq_id in self._requests for seq_id in sequence_ids):
            raise ValueError(f"request id {request_id!r} is already in use")
        vocab_size = self.runner.config.vocab_size
        if any(token_id >= vocab_size for token_id, _ in sampling.logit_bias):
            raise ValueError(f"logit_bias token ids must be in [0, {vocab_size})")
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
        self._requests[request_id] = self._state(sequence, request_id, 0, grammar)
        self._requests[request_id].forks_pending = sampling.n > 1
        self._choices[request_id] = [request_id]

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
        """Finish a request (every choice) now, freeing its blocks; returns the output of its last choice
        (`last` set), None if it is unknown or already finished."""
        sequence_ids = self._choices.get(request_id)
        if sequence_ids is None:
            return None
        output = None
        for sequence_id in list(sequence_ids):
            output = self._finish(self._requests[sequence_id], "abort", "")
        return output

    def step(self) -> list[RequestOutput]:
        """Run one scheduled batch; returns the outputs of requests that sampled a token."""
        scheduled = self.scheduler.schedule()
        steps = self._burst_steps(scheduled)
        if steps > 1:
            return self._burst(scheduled, steps)
        outputs: list[RequestOutput] = []
        if scheduled.chunks:
            parents = [
                self._requests[chunk.sequence.request_id] for chunk in scheduled.chunks if chunk.samples
            ]
            masks = self._masks.start([state.grammar for state in parents])  # filled during the forward
            model_chunks = [_model_chunk(chunk) for chunk in scheduled.chunks]
            logits = self.runner.execute(model_chunks, scheduled.block_copies)  # (len(parents), vocab)
            self.scheduler.advance(scheduled)
            sampling: list[RequestState] = []
            rows: list[int] = []  # the logits row of each sampling state (forked choices share one)
            if masks is not None:
                # A fork deep-copies its parent's matcher, which the mask thread may still be reading
                # (under load: "Already mutably borrowed").
                masks.wait()
            for row, state in enumerate(parents):
                for choice in [state, *self._fork(state)]:
                    sampling.append(choice)
                    rows.append(row)
            if len(rows) != logits.shape[0]:
                logits = logits[rows]  # (len(sampling), vocab): a copy, one row per choice
            # Logprobs describe the model: they are read from the logits before the grammar's mask.
            raw_logits = logits.clone() if masks is not None and wants_logprobs(sampling) else logits
            if masks is not None:
                # A fork's grammar is a copy of its parent's taken before any token: the parent's mask is
                # its mask too, so the mask rows follow the logits rows.
                masks.apply(logits, rows)
            token_ids = sample_batch(logits, [state.sampler for state in sampling])
            logprobs = self._logprobs(raw_logits, sampling, token_ids)
            now = time.monotonic()
            outputs = [
                self._append_token(state, token_id, now, logprobs.get(row))
                for row, (state, token_id) in enumerate(zip(sampling, token_ids, strict=True))
            ]
        self._record_step()
        return outputs

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def _burst_steps(self, scheduled: SchedulerOutput) -> int:
        """How many tokens this step decodes in one native call (`engine.burst`); 1 for a plain step."""
        chunks = scheduled.chunks
        state = self._requests.get(chunks[0].sequence.request_id) if len(chunks) == 1 else None
        return burst_steps(scheduled, self.scheduler, state, self.runner.bursts, self.config.burst_tokens)

    def _burst(self, scheduled: SchedulerOutput, steps: int) -> list[RequestOutput]:
        """One sequence's next `steps` greedy tokens from one native call, appended as single steps would
        append them (stop conditions, text, metrics), as one output. Tokens after one that finishes the
        sequence are dropped; their K/V, written past its end, is freed with its blocks."""
        [chunk] = scheduled.chunks
        state = self._requests[chunk.sequence.request_id]
        started = time.monotonic()
        stop_ids = sorted(state.stop_checker.stop_token_ids)
        tokens = self.runner.burst(_model_chunk(chunk), steps, stop_ids)
        self.scheduler.advance(scheduled)
        elapsed = time.monotonic() - started
        outputs: list[RequestOutput] = []
        for position, token_id in enumerate(tokens):
            if position > 0:
                if state.sequence.is_finished:
                    break
                self.scheduler.computed_ahead(state.sequence)  # the token before this one: computed
            # Each token's time is when the call had computed it, as far as an even split tells.
            outputs.append(
                self._append_token(state, token_id, started + elapsed * (position + 1) / len(tokens))
            )
        self._record_step()
        return [merged(outputs)]

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

    def _state(
        self, sequence: Sequence, request_id: str, index: int, grammar: RequestGrammar | None
    ) -> RequestState:
        return RequestState(
            sequence,
            RequestSampler(sequence.sampling, index),
            StopChecker(sequence.sampling, self.eos_token_ids),
            IncrementalDetokenizer(self.tokenizer, sequence.prompt_token_ids),
            request_id,
            index,
            grammar,
        )

    def _fork(self, state: RequestState) -> list[RequestState]:
        """At a request's first sample, its other choices: sequences sharing the prompt's blocks."""
        if not state.forks_pending:
            return []
        state.forks_pending = False
        parent = state.sequence
        children = []
        for index in range(1, parent.sampling.n):
            child = Sequence(
                choice_id(state.request_id, index),
                parent.prompt_token_ids,  # never mutated: shared
                parent.sampling,
                cache_salt=parent.cache_salt,
                priority=parent.priority,
                max_total_tokens=parent.max_total_tokens,
                arrival_time=parent.arrival_time,
            )
            self.scheduler.fork(parent, child)
            grammar = state.grammar.fork() if state.grammar is not None else None
            children.append(self._state(child, state.request_id, index, grammar))
            self._requests[child.request_id] = children[-1]
            self._choices[state.request_id].append(child.request_id)
        return children

    def _logprobs(
        self, logits: torch.Tensor, sampling: list[RequestState], token_ids: list[int]
    ) -> dict[int, TopLogprobs]:
        """Rows that asked for logprobs -> their chosen token's and the best alternatives' (raw logits)."""
        rows = [row for row, state in enumerate(sampling) if state.sequence.sampling.logprobs is not None]
        if not rows:
            return {}
        chosen = [token_ids[row] for row in rows]
        num_top = [sampling[row].sequence.sampling.logprobs or 0 for row in rows]
        return dict(zip(rows, top_logprobs(logits, rows, chosen, num_top), strict=True))

    def _append_token(
        self, state: RequestState, token_id: int, now: float, logprobs: TopLogprobs | None = None
    ) -> RequestOutput:
        sequence = state.sequence
        previous = sequence.last_token_time
        sequence.append_output_token(token_id, now)
        state.sampler.record(token_id)
        if previous is None:
            self.metrics.record_token(now - sequence.arrival_time, None)
        else:
            self.metrics.record_token(None, now - previous)
        new_text = state.detokenizer.add(token_id)
        state.text += new_text
        if logprobs is not None:
            state.logprobs.add(self._token_logprob(logprobs, new_text))
        finish = state.stop_checker.check(sequence.output_token_ids, state.text, len(new_text))
        grammar_may_end = finish is None or finish.reason is StopReason.LENGTH
        if grammar_may_end and state.grammar is not None and state.grammar.advance(token_id):
            # The grammar is complete (a whole JSON value): a structured answer ends here, even on its last
            # allowed token (then it is whole, not cut by max_tokens).
            return self._finish_whole(state, "stop", token_id)
        if finish is not None and finish.reason is StopReason.STOP:
            # A stop string ends the text before it; a stop token's own text (and logprob) is left out too.
            end = len(state.text) - len(new_text) if finish.text_end is None else finish.text_end
            if finish.text_end is None and logprobs is not None:
                state.logprobs.drop_last()
            released = state.logprobs.release(end, final=True)
            return self._finish(state, "stop", state.text[state.num_sent_chars : end], [token_id], released)
        if finish is not None or sequence.reached_length_limit():
            return self._finish_whole(state, "length", token_id)
        visible = len(state.text) - state.stop_checker.num_held_back_chars(state.text)
        delta = state.text[state.num_sent_chars : visible]
        state.num_sent_chars = max(state.num_sent_chars, visible)
        released = state.logprobs.release(state.num_sent_chars)
        return state.output(delta, [token_id], None, released)

    def _finish_whole(self, state: RequestState, reason: FinishReason, token_id: int) -> RequestOutput:
        """Finish with all of the text so far (nothing cut off), the detokenizer's held-back text included."""
        flushed = state.detokenizer.flush()
        state.text += flushed
        state.logprobs.extend_last(flushed)
        released = state.logprobs.release(len(state.text), final=True)
        return self._finish(state, reason, state.text[state.num_sent_chars :], [token_id], released)

    def _token_logprob(self, logprobs: TopLogprobs, text: str) -> TokenLogprob:
        """The sampled token as the text it added; alternatives as each token decodes alone."""
        top = tuple(
            (text if token_id == logprobs.token_id else self._token_text(token_id), logprob)
            for token_id, logprob in logprobs.top
        )
        return TokenLogprob(text, logprobs.logprob, top)

    def _token_text(self, token_id: int) -> str:
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def _finish(
        self,
        state: RequestState,
        reason: FinishReason,
        text: str,
        token_ids: list[int] | None = None,
        logprobs: tuple[TokenLogprob, ...] = (),
    ) -> RequestOutput:
        sequence = state.sequence
        self.scheduler.finish(sequence, reason)
        del self._requests[sequence.request_id]
        choices = self._choices[state.request_id]
        choices.remove(sequence.request_id)
        last = not choices
        if last:  # a request's prompt counts once, however many choices it forked into
            del self._choices[state.request_id]
            self.metrics.record_finished(reason, sequence.num_prompt_tokens)
        self._record_step()  # an abort between steps frees blocks too: keep the gauges true
        return state.output(text, token_ids or [], reason, logprobs, last)

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


def build_engine(loaded: LoadedModel, model_name: str, config: EngineConfig | None = None) -> LLMEngine:
    """An engine over a loaded model and its tokenizer; the weights' folder names the cache namespace."""
    return LLMEngine(
        loaded.model, loaded.tokenizer, config, model_name=model_name, model_revision=str(loaded.folder)
    )
