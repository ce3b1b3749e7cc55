"""When a step may decode several tokens in one native call: a lone greedy sequence, nothing else waiting.

A lone greedy sequence (nothing else running or waiting, no logprobs, penalties, bias or grammar) decodes
up to `EngineConfig.burst_tokens` tokens in one native call (`ModelRunner.burst`), inside the block that holds
its next position (`Scheduler.burst_room`); the loop then appends each token as a single step would append it,
and the scheduler counts the ones whose K/V the call wrote (`Scheduler.computed_ahead`). This module only
decides how many; it runs nothing.
"""

from __future__ import annotations

from engine.request_output import RequestState
from engine.scheduler import Scheduler, SchedulerOutput


def burst_steps(
    scheduled: SchedulerOutput,
    scheduler: Scheduler,
    state: RequestState | None,
    runner_bursts: bool,
    burst_tokens: int,
) -> int:
    """How many tokens this step may decode in one native call; 1 for a plain step.

    Only a lone greedy sequence that nothing else waits on, asking for nothing a token's logits must
    show (logprobs), change (penalties, bias) or mask (a grammar), bursts; and only within the block
    that holds its next position, which it holds alone, up to `burst_tokens`: the K/V a burst writes
    needs no slot the scheduler has not given. Its tokens are those single steps would sample. `state` is
    the scheduled sequence's (None when unknown)."""
    if len(scheduled.chunks) != 1 or scheduled.block_copies or scheduled.preempted or not runner_bursts:
        return 1
    [chunk] = scheduled.chunks
    if chunk.num_tokens != 1 or not chunk.samples or scheduler.waiting or len(scheduler.running) != 1:
        return 1
    if state is None or state.grammar is not None or state.forks_pending:
        return 1
    sequence = state.sequence
    sampling = sequence.sampling
    if not sampling.greedy or sampling.adjusts_logits or sampling.logprobs is not None:
        return 1
    left = min(
        sampling.max_tokens - sequence.num_output_tokens,
        sequence.max_total_tokens - sequence.num_tokens if sequence.max_total_tokens else sampling.max_tokens,
    )
    return max(1, min(burst_tokens, left, scheduler.burst_room(sequence)))
