"""Prefix-cache hit rate across several engine nodes: random routing next to prefix-affinity routing.

    .venv/bin/python bench/engine/bench_routing.py                    # 4 nodes, 4,000 requests, ~10 s
    .venv/bin/python bench/engine/bench_routing.py --nodes 8 --requests 8000 --seed 1

A simulation, not a measurement of the engine: each node is an LRU of KV block hashes with a fixed
capacity in blocks (the engine's pool evicts its free cached blocks least-recently-used first). Block
hashes are the real ones (`prefix.hash_block_tokens`, chained, the first block namespaced by model and
tenant), over made-up token ids. A request hits the leading blocks of its prompt that its node still
holds; afterwards the node holds every full block of the prompt and of the answer (decode blocks are
cached too, which is what lets the next turn of a chat hit).

The prompt mix (seeded): several tenants, each with a few long system prompts (Zipf popularity across
all of them), few-shot templates that begin with one of the tenant's system prompts, multi-turn chats
whose every turn re-sends the earlier turns and answers, and unique prompts that share nothing.

Policies, all over the same request sequence:
  - random: any node, uniformly.
  - prefix-affinity: consistent hashing (virtual nodes on a ring) on the first block's hash, so every
    request that opens with the same system prompt, for the same model and tenant, lands on one node;
    with a bounded-load fallback: a node already holding more than `--load-bound` x its fair share of
    the last `--window` requests is passed over for the next node on the ring.
  - prefix-affinity without the bound, to show what the bound costs and what it buys.
  - one node with all the nodes' capacity together: the hit rate a single shared cache would reach.

Printed per policy: prompt-token hit rate (cached / prompt tokens, the last token always recomputed),
and the imbalance max/mean over nodes of requests and of prefill tokens (prompt tokens not cached).
"""

from __future__ import annotations

import argparse
import bisect
import random
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prefix import NO_EXTRA_KEYS, BlockHash, ExtraKeys, blake2b_128, hash_block_tokens, model_key, tenant_key

VOCAB_SIZE = 49_152  # SmolLM2's vocabulary
MODEL = model_key("smollm2-135m-instruct", "0.1.2", "float32")
TENANTS = ("acme", "globex", "initech")
SYSTEM_PROMPTS_PER_TENANT = 4
TEMPLATES_PER_TENANT = 2
ZIPF_S = 1.1
CHAT_END_CHANCE = 1 / 6  # after each turn a chat ends with this chance (6 turns on average)
MAX_PROMPT_TOKENS = 6_000
VIRTUAL_NODES = 64
Item = TypeVar("Item")

# Share of requests of each kind; the rest are unique prompts.
MIX = {"single": 0.40, "few-shot": 0.15, "chat": 0.35}


@dataclass(frozen=True, slots=True)
class Request:
    """One request: its prompt's full-block hashes (plus the answer's), and its routing key."""

    prompt_tokens: int
    prompt_hashes: tuple[BlockHash, ...]
    answer_hashes: tuple[BlockHash, ...]
    routing_key: int


@dataclass(frozen=True, slots=True)
class Outcome:
    policy: str
    hit_rate: float
    requests_max_over_mean: float
    prefill_max_over_mean: float


class NodeCache:
    """The KV blocks one node still holds: an LRU of block hashes, `capacity` blocks at most."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[BlockHash, None] = OrderedDict()

    def serve(self, request: Request, block_size: int) -> int:
        """Count the prompt tokens whose KV is reused, then keep the request's blocks. Returns that count."""
        matched = 0
        for block_hash in request.prompt_hashes:
            if block_hash not in self._blocks:
                break
            matched += 1
        # The last prompt token is always computed (its logits start the answer), as in the engine.
        cached = min(matched * block_size, ((request.prompt_tokens - 1) // block_size) * block_size)
        for block_hash in (*request.prompt_hashes, *request.answer_hashes):
            self._blocks[block_hash] = None
            self._blocks.move_to_end(block_hash)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
        return cached


class AffinityRouter:
    """Consistent hashing on the first block's hash, passing over nodes past a bound on recent load."""

    def __init__(self, nodes: int, load_bound: float | None, window: int) -> None:
        points = sorted(
            (_ring_point(f"node-{node}-{virtual}".encode()), node)
            for node in range(nodes)
            for virtual in range(VIRTUAL_NODES)
        )
        self._ring_keys = [point for point, _ in points]
        self._ring_nodes = [node for _, node in points]
        self._nodes = nodes
        self._load_bound = load_bound
        self._recent: deque[int] = deque(maxlen=window)
        self._recent_counts = Counter[int]()

    def route(self, request: Request) -> int:
        start = bisect.bisect(self._ring_keys, request.routing_key) % len(self._ring_keys)
        chosen = self._ring_nodes[start]
        if self._load_bound is not None:
            limit = self._load_bound * (len(self._recent) + 1) / self._nodes
            for step in range(len(self._ring_nodes)):
                candidate = self._ring_nodes[(start + step) % len(self._ring_nodes)]
                if self._recent_counts[candidate] + 1 <= limit:
                    chosen = candidate
                    break
        if len(self._recent) == self._recent.maxlen:
            self._recent_counts[self._recent[0]] -= 1
        self._recent.append(chosen)
        self._recent_counts[chosen] += 1
        return chosen


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--capacity-tokens",
        type=int,
        nargs="+",
        default=[8192, 16384, 65536],
        help="KV cache per node, in tokens (KVGATE_KV_CACHE_TOKENS; default 16384)",
    )
    parser.add_argument("--load-bound", type=float, default=1.25)
    parser.add_argument("--window", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    requests = make_workload(random.Random(args.seed), args.requests, args.block_size)
    prompt_tokens = sum(request.prompt_tokens for request in requests)
    print(
        f"{args.nodes} nodes, {len(requests)} requests ({prompt_tokens / len(requests):.0f} prompt tokens "
        f"on average), block size {args.block_size}, seed {args.seed}"
    )
    print(f"mix: {_describe_mix()}; bounded load: {args.load_bound} x fair share of the last {args.window}")
    for capacity_tokens in args.capacity_tokens:
        capacity = capacity_tokens // args.block_size
        print(f"\nKV cache per node: {capacity_tokens} tokens ({capacity} blocks)")
        print(f"{'policy':<40}{'token hit rate':>16}{'requests max/mean':>20}{'prefill max/mean':>19}")
        affinity = AffinityRouter(args.nodes, args.load_bound, args.window)
        unbounded = AffinityRouter(args.nodes, None, args.window)
        policies: list[tuple[str, int, int, Callable[[Request], int]]] = [
            ("random", args.nodes, capacity, _random_router(random.Random(args.seed + 1), args.nodes)),
            (f"prefix-affinity, bounded load {args.load_bound}", args.nodes, capacity, affinity.route),
            ("prefix-affinity, unbounded", args.nodes, capacity, unbounded.route),
            (f"(one node, {args.nodes} x the capacity)", 1, capacity * args.nodes, lambda _: 0),
        ]
        for name, nodes, node_capacity, route in policies:
            outcome = simulate(name, requests, nodes, node_capacity, args.block_size, route)
            print(
                f"{outcome.policy:<40}{outcome.hit_rate:>16.1%}"
                f"{outcome.requests_max_over_mean:>20.2f}{outcome.prefill_max_over_mean:>19.2f}"
            )


def simulate(
    policy: str,
    requests: Sequence[Request],
    nodes: int,
    capacity: int,
    block_size: int,
    route: Callable[[Request], int],
) -> Outcome:
    """Serve `requests` in order on `nodes` LRU caches of `capacity` blocks, routing each with `route`."""
    caches = [NodeCache(capacity) for _ in range(nodes)]
    served = [0] * nodes
    prefilled = [0] * nodes
    cached_total = 0
    for request in requests:
        node = route(request)
        cached = caches[node].serve(request, block_size)
        served[node] += 1
        prefilled[node] += request.prompt_tokens - cached
        cached_total += cached
    return Outcome(
        policy=policy,
        hit_rate=cached_total / sum(request.prompt_tokens for request in requests),
        requests_max_over_mean=max(served) / (sum(served) / nodes),
        prefill_max_over_mean=max(prefilled) / (sum(prefilled) / nodes),
    )


def make_workload(rng: random.Random, count: int, block_size: int) -> list[Request]:
    """The seeded request sequence: shared system prompts and templates, growing chats, unique prompts."""
    system_prompts = {
        tenant: [_tokens(rng, rng.randint(200, 1500)) for _ in range(SYSTEM_PROMPTS_PER_TENANT)]
        for tenant in TENANTS
    }
    # A few-shot template opens with one of its tenant's system prompts, then its worked examples.
    templates = {
        tenant: [
            rng.choice(prompts) + _tokens(rng, rng.randint(800, 2000)) for _ in range(TEMPLATES_PER_TENANT)
        ]
        for tenant, prompts in system_prompts.items()
    }
    popular_prompts = _zipf_chooser(rng, [(t, p) for t, ps in system_prompts.items() for p in ps])
    popular_templates = _zipf_chooser(rng, [(t, p) for t, ps in templates.items() for p in ps])
    chats: list[tuple[str, list[int]]] = []  # open conversations: tenant, every token so far
    requests: list[Request] = []
    for _ in range(count):
        kind = rng.random()
        if kind < MIX["single"]:
            tenant, system = popular_prompts()
            prompt = system + _tokens(rng, rng.randint(20, 200))
        elif kind < MIX["single"] + MIX["few-shot"]:
            tenant, template = popular_templates()
            prompt = template + _tokens(rng, rng.randint(30, 120))
        elif kind < MIX["single"] + MIX["few-shot"] + MIX["chat"]:
            if chats and rng.random() < 0.7:
                index = rng.randrange(len(chats))
                tenant, history = chats[index]
                prompt = history + _tokens(rng, rng.randint(20, 80))
            else:
                tenant, system = popular_prompts()
                prompt, index = system + _tokens(rng, rng.randint(20, 120)), len(chats)
                chats.append((tenant, prompt))
            answer = _tokens(rng, rng.randint(50, 300))
            if len(prompt) + len(answer) < MAX_PROMPT_TOKENS and rng.random() > CHAT_END_CHANCE:
                chats[index] = (tenant, prompt + answer)
            else:
                chats.pop(index)  # the conversation ends
            requests.append(_request(tenant, prompt, answer, block_size))
            continue
        else:
            tenant, prompt = rng.choice(TENANTS), _tokens(rng, rng.randint(50, 600))
        requests.append(_request(tenant, prompt, _tokens(rng, rng.randint(50, 300)), block_size))
    return requests


def _request(tenant: str, prompt: list[int], answer: list[int], block_size: int) -> Request:
    hashes = _block_hashes(prompt + answer, ExtraKeys.of(MODEL, tenant_key(tenant)), block_size)
    prompt_blocks = len(prompt) // block_size
    return Request(
        prompt_tokens=len(prompt),
        prompt_hashes=tuple(hashes[:prompt_blocks]),
        answer_hashes=tuple(hashes[prompt_blocks:]),
        routing_key=int.from_bytes(hashes[0][:8], "big"),
    )


def _block_hashes(tokens: list[int], extra_keys: ExtraKeys, block_size: int) -> list[BlockHash]:
    hashes: list[BlockHash] = []
    parent: BlockHash | None = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        keys = extra_keys if parent is None else NO_EXTRA_KEYS
        parent = hash_block_tokens(blake2b_128, parent, tokens[start : start + block_size], keys)
        hashes.append(parent)
    return hashes


def _tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(VOCAB_SIZE) for _ in range(count)]


def _zipf_chooser(rng: random.Random, items: list[Item]) -> Callable[[], Item]:
    ranked = rng.sample(items, len(items))  # popularity rank independent of tenant and length
    weights = [1 / rank**ZIPF_S for rank in range(1, len(ranked) + 1)]
    return lambda: rng.choices(ranked, weights)[0]


def _random_router(rng: random.Random, nodes: int) -> Callable[[Request], int]:
    return lambda _: rng.randrange(nodes)


def _ring_point(label: bytes) -> int:
    return int.from_bytes(blake2b_128(label)[:8], "big")


def _describe_mix() -> str:
    unique = 1 - sum(MIX.values())
    shares = ", ".join(f"{share:.0%} {kind}" for kind, share in MIX.items())
    return (
        f"{shares}, {unique:.0%} unique; {len(TENANTS)} tenants x {SYSTEM_PROMPTS_PER_TENANT} system prompts "
        f"(Zipf s={ZIPF_S}), {TEMPLATES_PER_TENANT} few-shot templates each; chats of {1 / CHAT_END_CHANCE:.0f} turns on average"
    )


if __name__ == "__main__":
    main()
