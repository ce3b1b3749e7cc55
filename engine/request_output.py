"""What the step loop hands back per request and step (`RequestOutput`), and what it keeps per choice while a
request runs (`RequestState`: its sequence, sampler, stop checker, detokenizer, grammar and pending text).

Knows the pieces a choice is made of; the loop (`engine/engine.py`) decides when they change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine.detokenizer import IncrementalDetokenizer
from engine.grammar import RequestGrammar
from engine.logprobs import PendingLogprobs, TokenLogprob
from engine.sampler import RequestSampler
from engine.sequence import FinishReason, Sequence
from engine.stopping import StopChecker


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
    index: int = 0
    """The choice (0 .. n-1) this output belongs to; `completion_tokens` and `finish_reason` are its own."""
    logprobs: tuple[TokenLogprob, ...] = ()
    """The log-probabilities of the tokens whose text this output releases (when the request asked)."""
    last: bool = False
    """Every choice of the request has finished: nothing more will come for it."""


@dataclass(slots=True)
class RequestState:
    """One choice of a running request."""

    sequence: Sequence
    sampler: RequestSampler
    stop_checker: StopChecker
    detokenizer: IncrementalDetokenizer
    request_id: str
    """The caller's id (the sequence's own id differs for choices after the first)."""
    index: int = 0
    grammar: RequestGrammar | None = None
    """This choice's own position in the request's grammar (a fork gets a copy)."""
    forks_pending: bool = False
    """Choices still to fork from this one at its first sample."""
    text: str = ""
    num_sent_chars: int = 0
    logprobs: PendingLogprobs = field(default_factory=PendingLogprobs)

    def output(
        self,
        text: str,
        token_ids: list[int],
        reason: FinishReason | None,
        logprobs: tuple[TokenLogprob, ...] = (),
        last: bool = False,
    ) -> RequestOutput:
        """This choice's output for one step: `text` and `token_ids` new, its counts so far."""
        sequence = self.sequence
        return RequestOutput(
            self.request_id,
            text,
            token_ids,
            reason,
            prompt_tokens=sequence.num_prompt_tokens,
            completion_tokens=sequence.num_output_tokens,
            cached_tokens=sequence.num_cached_prompt_tokens or 0,
            index=self.index,
            logprobs=logprobs,
            last=last,
        )


def merged(outputs: list[RequestOutput]) -> RequestOutput:
    """One request's consecutive outputs (one choice, no logprobs) as one: the text and tokens of all, the
    end of the last."""
    last = outputs[-1]
    return dataclasses.replace(
        last,
        text="".join(output.text for output in outputs),
        token_ids=[token_id for output in outputs for token_id in output.token_ids],
    )


def choice_id(request_id: str, index: int) -> str:
    """The sequence id of a request's choice: the request's own id for the first."""
    return request_id if index == 0 else f"{request_id}#{index}"


def wants_logprobs(states: list[RequestState]) -> bool:
    return any(state.sequence.sampling.logprobs is not None for state in states)
