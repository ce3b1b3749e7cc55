"""Which tokens of which sequences the next step computes: a token budget, filled in order.

Each step has `max_num_batched_tokens` to spend. There are no phases; a sequence just has tokens whose K/V
is not yet computed (see `engine.sequence`). The budget goes, in order, to
  1. running sequences that are decoding (one token each), most important first; when a new token needs
     a block and none is free, the least important running sequence (lowest priority, then newest) is
     preempted: its blocks are freed (they keep their hashes, so it re-hits them later) and it waits again;
  2. running sequences part-way through a (chunked) prefill, as much as the budget allows;
  3. waiting sequences, admitted while the budget, `max_num_seqs` and the block pool allow. They are
     ordered by priority, then by the longest cached prefix first (a hit costs almost nothing), then by
     arrival; a request passed over `starvation_limit` times goes ahead of every priority and cache
     preference (aging), so a flood of high-priority work never starves the rest.
     A waiting request whose uncached prefix is being prefilled right now by a running sequence of the
     same namespace waits for those blocks to be cached, so a shared prefix is computed once.
No waiting request is admitted in a step that preempted someone. A request with several choices is one
sequence until its prompt is computed; then `fork` adds a running sequence per other choice that shares
its blocks (the block manager copies a shared, partly filled block when a choice first writes to it, and
the step's `block_copies` say which). The scheduler counts tokens and blocks; it never touches tensors,
text or the sampler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sequence import FinishReason, Sequence, SequenceStatus
from prefix.hashing import ExtraKey, ExtraKeys, tenant_key
from prefix.manager import BlockManager, PrefixMatch
from prefix.stats import PrefixCacheStats


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 512
    """Tokens computed per step, decode and prefill together: bounds a step's latency."""
    max_num_seqs: int = 64
    """Running sequences at most."""
    starvation_limit: int = 8
    """Admission rounds a waiting request may be overtaken by later ones before it goes first."""
    max_waiting_lookups: int = 128
    """Waiting requests whose cached prefix is looked up per step (the oldest / most important)."""

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "starvation_limit", "max_waiting_lookups"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """One sequence's work in a step: tokens [start, start + num_tokens) over these blocks."""

    sequence: Sequence
    start: int
    num_tokens: int
    block_table: list[int]

    @property
    def token_ids(self) -> list[int]:
        return self.sequence.token_ids(self.start, self.start + self.num_tokens)

    @property
    def samples(self) -> bool:
        """Whether the chunk reaches the sequence's last token, whose logits give the next token."""
        return self.start + self.num_tokens == self.sequence.num_tokens


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk]
    preempted: list[Sequence]
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    """(source, destination) KV blocks to copy before the forward pass (copy-on-write of forked choices)."""

    @property
    def num_batched_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)


class Scheduler:
    """Owns the waiting and running sequences and the block manager; not thread-safe (the step loop owns it)."""

    def __init__(
        self, config: SchedulerConfig, block_manager: BlockManager, model_key: ExtraKey | None = None
    ) -> None:
        self.config = config
        self.block_manager = block_manager
        self._model_key = model_key
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self._by_id: dict[str, Sequence] = {}
        self._extra_keys: dict[str, ExtraKeys] = {}
        self._num_reserved: dict[str, int] = {}  # tokens the block manager holds slots for
        self._num_arrivals = 0
        self.num_preemptions = 0

    # Public API ---------------------------------------------------------------------------------

    def add(self, sequence: Sequence) -> None:
        """Queue a new request. Its id must be unique among unfinished ones."""
        if sequence.request_id in self._by_id:
            raise ValueError(f"request {sequence.request_id!r} is already scheduled")
        sequence.arrival_index = self._num_arrivals
        self._num_arrivals += 1
        sequence.status = SequenceStatus.WAITING
        keys = [self._model_key] if self._model_key is not None else []
        if sequence.cache_salt is not None:
            keys.append(tenant_key(sequence.cache_salt))
        self._extra_keys[sequence.request_id] = ExtraKeys.of(*keys)
        self._by_id[sequence.request_id] = sequence
        self.waiting.append(sequence)

    def schedule(self) -> SchedulerOutput:
        """Spend one step's token budget (see the module docstring for the order)."""
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[Sequence] = []
        by_importance = sorted(self.running, key=_importance)
        scheduled: set[str] = set()
        for sequence in by_importance:
            if budget == 0:
                break
            if sequence.status is not SequenceStatus.RUNNING or sequence.is_prefilling:
                continue
            if self._reserve_slots(sequence, scheduled, preempted):
                chunks.append(self._chunk(sequence, 1))
                scheduled.add(sequence.request_id)
                budget -= 1
        for sequence in by_importance:
            if budget == 0:
                break
            if sequence.status is SequenceStatus.RUNNING and sequence.is_prefilling:
                num_tokens = min(sequence.num_uncomputed_tokens, budget)
                chunks.append(self._chunk(sequence, num_tokens))
                budget -= num_tokens
        if not preempted:
            chunks.extend(self._admit(budget))
        return SchedulerOutput(chunks, preempted, self.block_manager.take_block_copies())

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Run `child` beside running `parent` from here on, sharing its blocks and computed tokens (parallel
        sampling: `child` has the parent's prompt and no output yet)."""
        if parent.status is not SequenceStatus.RUNNING:
            raise ValueError(f"only a running sequence can be forked, {parent.request_id!r} is not")
        if child.request_id in self._by_id:
            raise ValueError(f"request {child.request_id!r} is already scheduled")
        parent_id, child_id = parent.request_id, child.request_id
        self.block_manager.fork(parent_id, child_id)
        child.arrival_index = parent.arrival_index
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_prompt_tokens = parent.num_cached_prompt_tokens
        child.status = SequenceStatus.RUNNING
        self._extra_keys[child_id] = self._extra_keys[parent_id]
        self._num_reserved[child_id] = self._num_reserved[parent_id]
        self._by_id[child_id] = child
        self.running.append(child)

    def advance(self, output: SchedulerOutput) -> None:
        """After the forward pass: the chunks' K/V exists, so count it computed and make full blocks reusable."""
        for chunk in output.chunks:
            sequence = chunk.sequence
            if sequence.status is not SequenceStatus.RUNNING:
                continue  # finished (aborted) while the step ran
            sequence.num_computed_tokens = chunk.start + chunk.num_tokens
            self.block_manager.cache_full_blocks(sequence.request_id, sequence.num_computed_tokens)

    def burst_room(self, sequence: Sequence) -> int:
        """Tokens a running sequence about to compute its last token may compute in a row without another
        block: from that token's position to the end of the block holding it, which it holds alone (0 when
        another sequence shares that block)."""
        if not self.block_manager.holds_last_block_alone(sequence.request_id):
            return 0
        block_size = self.block_manager.block_size
        return block_size - sequence.num_computed_tokens % block_size

    def computed_ahead(self, sequence: Sequence) -> None:
        """The token appended last already has its K/V, written by a burst (`LLMEngine`) inside the block
        the sequence holds: give it that slot and count it computed, as `schedule` and `advance` would."""
        request_id = sequence.request_id
        new_token_ids = sequence.token_ids(self._num_reserved[request_id])
        if len(new_token_ids) != 1 or not self.block_manager.holds_last_block_alone(request_id):
            raise RuntimeError(
                f"{request_id!r}: a burst's token must follow one reserved token in its own block"
            )
        blocks = len(self.block_manager.block_table(request_id))
        if not self.block_manager.append_slots(request_id, new_token_ids):
            raise RuntimeError(f"{request_id!r}: no slot for a burst's token")
        if len(self.block_manager.block_table(request_id)) != blocks:
            raise RuntimeError(f"{request_id!r}: a burst's token left the block it was written in")
        self._num_reserved[request_id] = sequence.num_tokens
        sequence.num_computed_tokens = sequence.num_tokens
        self.block_manager.cache_full_blocks(request_id, sequence.num_computed_tokens)

    def finish(self, sequence: Sequence, reason: FinishReason) -> None:
        """End a sequence (stopped, length, aborted) and free its blocks at once."""
        if sequence.is_finished:
            return
        request_id = sequence.request_id
        if sequence.status is SequenceStatus.RUNNING:
            self.running.remove(sequence)
            self.block_manager.free(request_id)
        else:
            self.waiting.remove(sequence)
        sequence.status = SequenceStatus.FINISHED
        sequence.finish_reason = reason
        del self._by_id[request_id], self._extra_keys[request_id]
        self._num_reserved.pop(request_id, None)

    def get(self, request_id: str) -> Sequence | None:
        return self._by_id.get(request_id)

    def has_unfinished(self) -> bool:
        return bool(self._by_id)

    def stats(self) -> PrefixCacheStats:
        return self.block_manager.stats()

    # Helpers ------------------------------------------------------------------------------------

    def _chunk(self, sequence: Sequence, num_tokens: int) -> ScheduledChunk:
        block_table = self.block_manager.block_table(sequence.request_id)
        return ScheduledChunk(sequence, sequence.num_computed_tokens, num_tokens, block_table)

    def _reserve_slots(self, sequence: Sequence, scheduled: set[str], preempted: list[Sequence]) -> bool:
        """Give the sequence's sampled token a KV slot, preempting less important sequences if needed.
        False when the sequence itself was the least important and got preempted."""
        request_id = sequence.request_id
        new_token_ids = sequence.token_ids(self._num_reserved[request_id])
        while not self.block_manager.append_slots(request_id, new_token_ids):
            candidates = [seq for seq in self.running if seq.request_id not in scheduled]
            victim = max(candidates, key=_importance)  # the sequence itself is always a candidate
            self._preempt(victim)
            preempted.append(victim)
            if victim is sequence:
                return False
        self._num_reserved[request_id] = sequence.num_tokens
        return True

    def _preempt(self, sequence: Sequence) -> None:
        self.running.remove(sequence)
        self.block_manager.free(sequence.request_id)
        sequence.status = SequenceStatus.WAITING
        sequence.num_computed_tokens = 0
        sequence.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.append(sequence)

    def _admit(self, budget: int) -> list[ScheduledChunk]:
        chunks: list[ScheduledChunk] = []
        admitted: list[Sequence] = []
        if budget == 0 or not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return chunks  # skip the prefix lookups: nobody can be admitted
        for sequence, match in self._waiting_candidates():
            if budget == 0 or len(self.running) >= self.config.max_num_seqs:
                break
            if self._prefix_in_flight(sequence, match):
                continue  # a running sequence is computing blocks this one would hit: wait for them
            request_id = sequence.request_id
            if not self.block_manager.allocate(
                request_id, sequence.token_ids(), self._extra_keys[request_id]
            ):
                break  # no room: wait for blocks rather than let smaller requests overtake forever
            self._num_reserved[request_id] = sequence.num_tokens
            num_cached = self.block_manager.num_cached_tokens(request_id)
            sequence.num_computed_tokens = num_cached
            if sequence.num_cached_prompt_tokens is None:
                sequence.num_cached_prompt_tokens = min(num_cached, sequence.num_prompt_tokens)
            sequence.status = SequenceStatus.RUNNING
            self.waiting.remove(sequence)
            self.running.append(sequence)
            admitted.append(sequence)
            num_tokens = min(sequence.num_uncomputed_tokens, budget)
            chunks.append(self._chunk(sequence, num_tokens))
            budget -= num_tokens
        if admitted:
            latest = max(sequence.arrival_index for sequence in admitted)
            for sequence in self.waiting:
                if sequence.arrival_index < latest:
                    sequence.num_times_passed_over += 1
        return chunks

    def _waiting_candidates(self) -> list[tuple[Sequence, PrefixMatch]]:
        """Waiting sequences in admission order, with the cached prefix each would reuse now."""
        limit = self.config.starvation_limit
        ranked = sorted(self.waiting, key=_importance)
        # Starving requests are always looked at, whatever their priority (aging beats priority).
        starving_first = [s for s in ranked if s.num_times_passed_over >= limit] + [
            s for s in ranked if s.num_times_passed_over < limit
        ]
        oldest = starving_first[: self.config.max_waiting_lookups]
        lookup = self.block_manager.find_cached_prefix
        matched = [
            (sequence, lookup(sequence.token_ids(), self._extra_keys[sequence.request_id]))
            for sequence in oldest
        ]

        def order(item: tuple[Sequence, PrefixMatch]) -> tuple[int, bool, int, int]:
            sequence, match = item
            if sequence.num_times_passed_over >= limit:
                return (0, 0, 0, sequence.arrival_index)  # starving: oldest first, ahead of any priority
            return (1, -sequence.priority, -match.num_cached_tokens, sequence.arrival_index)

        return sorted(matched, key=order)

    def _prefix_in_flight(self, sequence: Sequence, match: PrefixMatch) -> bool:
        """Whether a running, still-prefilling sequence of the same namespace is computing full blocks of
        this sequence's prefix beyond what is cached now."""
        keys = self._extra_keys[sequence.request_id]
        block_size = self.block_manager.block_size
        hittable = (sequence.num_tokens - 1) // block_size * block_size  # the last token is always computed
        if hittable <= match.num_cached_tokens:
            return False
        for other in self.running:
            if not other.is_prefilling or self._extra_keys[other.request_id] != keys:
                continue
            shared = _shared_full_blocks(sequence, other, hittable, block_size)
            if shared > match.num_cached_tokens and other.num_computed_tokens < shared:
                return True
        return False


def _importance(sequence: Sequence) -> tuple[int, int]:
    """Sort key: most important first (higher priority, then older)."""
    return (-sequence.priority, sequence.arrival_index)


def _shared_full_blocks(first: Sequence, second: Sequence, limit: int, block_size: int) -> int:
    """Tokens in whole blocks, at most `limit`, that both sequences share from their start."""
    limit = min(limit, second.num_tokens // block_size * block_size)
    shared = 0
    while shared + block_size <= limit:
        end = shared + block_size
        if first.token_ids(shared, end) != second.token_ids(shared, end):
            break
        shared = end
    return shared
