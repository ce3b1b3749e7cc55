"""The scheduler alone, no model: how a step's token budget is spent, who is admitted first, who is
preempted, and that a shared uncached prefix is computed once. Sampled tokens are made up."""

from __future__ import annotations

import itertools

import pytest

from engine.sampler import SamplingParams
from engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from engine.sequence import Sequence, SequenceStatus
from prefix.manager import BlockManager, BlockManagerConfig

BLOCK_SIZE = 4
_ids = itertools.count()


def make_scheduler(num_blocks: int = 64, **config: int) -> Scheduler:
    manager = BlockManager(BlockManagerConfig(num_blocks, BLOCK_SIZE))
    return Scheduler(SchedulerConfig(**config), manager)


def make_sequence(prompt: list[int] | int, priority: int = 0, max_tokens: int = 100) -> Sequence:
    """A sequence with these prompt tokens, or with that many tokens shared with no other sequence."""
    number = next(_ids)
    token_ids = (
        [1000 * (number + 1) + index for index in range(prompt)] if isinstance(prompt, int) else prompt
    )
    return Sequence(f"seq-{number}", token_ids, SamplingParams(max_tokens=max_tokens), priority=priority)


def step(scheduler: Scheduler, token_id: int = 7) -> SchedulerOutput:
    """One step as the engine runs it, with a fixed 'sampled' token."""
    output = scheduler.schedule()
    scheduler.advance(output)
    for chunk in output.chunks:
        if chunk.samples:
            chunk.sequence.append_output_token(token_id, now=0.0)
    return output


def work(output: SchedulerOutput) -> list[tuple[str, int]]:
    return [(chunk.sequence.request_id, chunk.num_tokens) for chunk in output.chunks]


def test_decode_tokens_go_first_and_a_long_prompt_is_prefilled_in_chunks_beside_them() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=8)
    first, second = make_sequence(3), make_sequence(3)
    scheduler.add(first)
    scheduler.add(second)
    assert work(step(scheduler)) == [(first.request_id, 3), (second.request_id, 3)]
    long = make_sequence(20)
    scheduler.add(long)
    for _ in range(3):  # 6 + 6 + 6 prompt tokens beside two decodes
        assert work(step(scheduler)) == [(first.request_id, 1), (second.request_id, 1), (long.request_id, 6)]
    assert work(step(scheduler)) == [(first.request_id, 1), (second.request_id, 1), (long.request_id, 2)]
    assert long.num_output_tokens == 1 and not long.is_prefilling


def test_max_num_seqs_caps_the_running_set() -> None:
    scheduler = make_scheduler(max_num_seqs=2)
    sequences = [make_sequence(5) for _ in range(3)]
    for sequence in sequences:
        scheduler.add(sequence)
    step(scheduler)
    assert [sequence.status for sequence in sequences] == [
        SequenceStatus.RUNNING,
        SequenceStatus.RUNNING,
        SequenceStatus.WAITING,
    ]


def test_the_waiting_request_with_the_longest_cached_prefix_is_admitted_first() -> None:
    scheduler = make_scheduler(max_num_seqs=1)
    shared = list(range(12))
    warm_up = make_sequence([*shared, 50])
    scheduler.add(warm_up)
    step(scheduler)
    scheduler.finish(warm_up, "stop")
    cold, warm = make_sequence([90, 91, 92, 93, 94]), make_sequence([*shared, 60, 61])
    scheduler.add(cold)  # arrives first, shares nothing
    scheduler.add(warm)
    output = step(scheduler)
    assert work(output) == [(warm.request_id, 2)]  # 12 tokens came from the cache
    assert warm.num_cached_prompt_tokens == 12


def test_a_request_passed_over_starvation_limit_times_goes_ahead_of_cache_hits() -> None:
    scheduler = make_scheduler(max_num_seqs=1, starvation_limit=2)
    shared = list(range(8))
    warm_up = make_sequence([*shared, 1])
    scheduler.add(warm_up)
    step(scheduler)
    scheduler.finish(warm_up, "stop")
    cold = make_sequence([90, 91, 92])
    scheduler.add(cold)
    admitted = []
    for round_index in range(4):
        scheduler.add(make_sequence([*shared, 100 + round_index]))
        running = step(scheduler).chunks[0].sequence
        admitted.append(running)
        scheduler.finish(running, "stop")
    assert cold.num_times_passed_over == 2
    assert admitted[2] is cold  # two hits went first, then aging put the cold request ahead


def test_higher_priority_waits_less_and_is_preempted_last() -> None:
    scheduler = make_scheduler(max_num_seqs=1)
    low, high = make_sequence(3, priority=0), make_sequence(3, priority=5)
    scheduler.add(low)
    scheduler.add(high)
    assert work(step(scheduler)) == [(high.request_id, 3)]


def test_running_out_of_blocks_preempts_the_least_important_newest_sequence() -> None:
    # 6 blocks of 4: three sequences of 7 prompt tokens take 2 blocks each; the 9th token needs a third.
    scheduler = make_scheduler(num_blocks=6)
    oldest, middle, newest = make_sequence(7), make_sequence(7), make_sequence(7)
    for sequence in (oldest, middle, newest):
        scheduler.add(sequence)
    step(scheduler)  # prefill: each samples its 8th token
    step(scheduler)  # decode of token 8 fills block 2; each samples a 9th
    output = step(scheduler)  # token 9 needs a new block for everyone: the newest makes room for two
    assert output.preempted == [newest]
    assert work(output) == [(oldest.request_id, 1), (middle.request_id, 1)]
    assert newest.status is SequenceStatus.WAITING and newest.num_computed_tokens == 0
    assert newest.request_id not in scheduler.block_manager
    assert scheduler.block_manager.stats().num_blocks_in_use == 6


def test_a_low_priority_sequence_is_preempted_before_a_newer_high_priority_one() -> None:
    scheduler = make_scheduler(num_blocks=4)
    low, high = make_sequence(7, priority=0), make_sequence(7, priority=1)
    scheduler.add(low)
    scheduler.add(high)
    step(scheduler)
    step(scheduler)
    output = step(scheduler)
    assert output.preempted == [low]
    assert work(output) == [(high.request_id, 1)]


def test_a_preempted_sequence_recomputes_from_its_own_cached_blocks() -> None:
    # 7 blocks: the oldest takes the free one for its 9th token, the middle one makes the newest give way
    # and takes its tail block (freed first, so evicted first); the newest's first block stays cached.
    scheduler = make_scheduler(num_blocks=7)
    sequences = [make_sequence(7) for _ in range(3)]
    for sequence in sequences:
        scheduler.add(sequence)
    step(scheduler)
    step(scheduler)
    [victim] = step(scheduler).preempted
    for sequence in sequences:
        if sequence.status is SequenceStatus.RUNNING:
            scheduler.finish(sequence, "stop")
    output = step(scheduler)
    [chunk] = [chunk for chunk in output.chunks if chunk.sequence is victim]
    assert (chunk.start, chunk.num_tokens) == (BLOCK_SIZE, 9 - BLOCK_SIZE)  # 7 prompt + 2 output tokens
    assert victim.num_preemptions == 1


def test_requests_sharing_an_uncached_prefix_compute_it_once() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=8)
    shared = list(range(16))
    first, second = make_sequence([*shared, 70, 71]), make_sequence([*shared, 80, 81, 82])
    scheduler.add(first)
    scheduler.add(second)
    computed = []
    while second.num_output_tokens == 0:
        computed.extend(work(step(scheduler)))
    assert second.num_cached_prompt_tokens == 16  # it waited for the first's blocks instead of recomputing
    prefill_tokens = sum(count for request_id, count in computed if request_id == second.request_id)
    assert prefill_tokens == 3
    assert scheduler.block_manager.stats().prefix_cache_hits == 16


def test_different_salts_do_not_wait_for_each_others_prefix() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=64)
    shared = list(range(16))
    first = Sequence("a", [*shared, 1], SamplingParams(), cache_salt="tenant-a")
    second = Sequence("b", [*shared, 2], SamplingParams(), cache_salt="tenant-b")
    scheduler.add(first)
    scheduler.add(second)
    assert work(step(scheduler)) == [("a", 17), ("b", 17)]
    tables = [set(scheduler.block_manager.block_table(request_id)) for request_id in ("a", "b")]
    assert not tables[0] & tables[1]


def test_finish_frees_blocks_of_running_and_forgets_waiting_sequences() -> None:
    scheduler = make_scheduler(max_num_seqs=1)
    running, waiting = make_sequence(9), make_sequence(9)
    scheduler.add(running)
    scheduler.add(waiting)
    step(scheduler)
    scheduler.finish(running, "abort")
    scheduler.finish(waiting, "abort")
    assert scheduler.block_manager.stats().num_blocks_in_use == 0
    assert not scheduler.has_unfinished()
    assert running.finish_reason == "abort" and waiting.status is SequenceStatus.FINISHED


def test_config_refuses_non_positive_limits() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(max_num_batched_tokens=0)


def test_aging_beats_priority_so_low_priority_never_starves() -> None:
    """Under a steady stream of high-priority arrivals, a low-priority request is admitted once it has been
    passed over `starvation_limit` times."""
    scheduler = make_scheduler(num_blocks=64, max_num_seqs=1, starvation_limit=3)
    low = make_sequence(8, priority=0, max_tokens=1)
    scheduler.add(low)
    admitted_at = None
    for round_index in range(12):
        high = make_sequence(8, priority=5, max_tokens=1)
        scheduler.add(high)
        output = scheduler.schedule()
        running = [chunk.sequence for chunk in output.chunks]
        if low in running:
            admitted_at = round_index
            break
        for sequence in running:  # finish whatever ran so the next round admits again
            scheduler.finish(sequence, "stop")
    assert admitted_at is not None and admitted_at <= 4
