"""Routing decisions, without sending anything: the canary split, prefix affinity with bounded load,
rendezvous hashing, weighted round-robin and least-loaded, on real pools of members."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from gateway.backends.protocol import GenerationRequest
from gateway.fleet.config import MemberSpec, PoolSpec, Routing
from gateway.fleet.health import HealthPolicy
from gateway.fleet.member import ClientOptions, Member
from gateway.fleet.pool import Pool
from gateway.fleet.routing import make_policy, rendezvous

SYSTEM = "You are a careful assistant for a large retailer. " * 20


def make_pool(*specs: MemberSpec, routing: Routing = "prefix", load_bound: float = 1.25) -> Pool:
    members = [
        Member(spec, spec.api_base, f"m{index}", ClientOptions(), HealthPolicy(), admitted=True)
        for index, spec in enumerate(specs)
    ]
    return Pool(PoolSpec("llm", ("llm",), routing, tuple(specs)), make_policy(routing, load_bound), members)


def member(weight: float = 1.0, *, canary: bool = False, host: str = "") -> MemberSpec:
    return MemberSpec(
        api_base=f"http://backend-{host}{weight}-{canary}.invalid/v1", weight=weight, canary=canary
    )


def equal(count: int) -> list[MemberSpec]:
    return [member(host=f"h{index}-") for index in range(count)]


def request(tenant: str = "t", *messages: str, system: str | None = SYSTEM, **body: Any) -> GenerationRequest:
    turns = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user" if index % 2 == 0 else "assistant", "content": text}
        for index, text in enumerate(messages)
    ]
    return GenerationRequest(
        request_id="r",
        tenant=tenant,
        model="llm",
        messages=turns,
        prompt=None,
        max_tokens=4,
        temperature=0.0,
        top_p=1.0,
        seed=None,
        stop=[],
        body={"model": "llm", "messages": turns, **body},
    )


def test_weights_99_to_1_send_1_percent_of_tenants_to_the_canary_and_keep_each_on_its_side() -> None:
    pool = make_pool(member(99), member(1, canary=True))
    canary = pool.members[1]
    sides = {
        f"tenant-{index}": pool.route(request(f"tenant-{index}", "hi")).members[0] for index in range(10_000)
    }
    share = sum(chosen is canary for chosen in sides.values()) / len(sides)
    assert 0.007 <= share <= 0.013, share
    for tenant in list(sides)[:200]:  # the same tenant, any prompt, always the same side
        assert {pool.route(request(tenant, f"question {turn}")).members[0] for turn in range(5)} == {
            sides[tenant]
        }


def test_raising_the_canary_weight_keeps_every_canary_tenant_on_the_canary() -> None:
    before = make_pool(member(99), member(1, canary=True))
    after = make_pool(member(90), member(10, canary=True))
    tenants = [f"tenant-{index}" for index in range(5_000)]
    was = {tenant for tenant in tenants if before.route(request(tenant, "hi")).members[0].canary}
    now = {tenant for tenant in tenants if after.route(request(tenant, "hi")).members[0].canary}
    assert was <= now and 0.08 <= len(now) / len(tenants) <= 0.12


def test_a_user_is_sticky_too_and_an_ejected_side_hands_its_tenants_over() -> None:
    pool = make_pool(member(1), member(1, canary=True))
    sides = Counter(
        pool.route(request("acme", "hi", user=f"user-{index}")).members[0].name for index in range(400)
    )
    assert 150 < sides["m0"] < 250  # users of one tenant fall on both sides
    assert {pool.route(request("acme", "again", user="user-7")).members[0] for _ in range(5)} == {
        pool.route(request("acme", "hi", user="user-7")).members[0]
    }
    pool.members[1].health.record_failure()
    for _ in range(5):
        pool.members[1].health.record_failure()
    assert {pool.route(request(f"t{index}", "hi")).members[0].name for index in range(50)} == {"m0"}


def test_prefix_routing_keeps_a_conversation_and_a_system_prompt_on_one_member() -> None:
    pool = make_pool(member(1), member(2), member(3))
    first = pool.route(request("a", "What is a KV cache?"))
    pool.sent(first.members[0], first)
    turn_two = pool.route(request("b", "What is a KV cache?", "Keys and values.", "And paging?"))
    assert turn_two.members[0] is first.members[0]
    assert set(turn_two.members) == set(pool.members)  # the rest follow, for failover


def test_new_prompts_are_placed_by_rendezvous_hashing_and_spread() -> None:
    pool = make_pool(*equal(3))
    placed = Counter()
    for index in range(300):
        route = pool.route(request("t", "hello", system=f"system prompt number {index}"))
        placed[route.members[0].name] += 1
        pool.sent(route.members[0], route)
    assert set(placed) == {"m0", "m1", "m2"} and max(placed.values()) / (300 / 3) <= 1.25 + 0.01


def test_a_hot_prompt_spills_over_once_its_member_is_past_the_bound() -> None:
    pool = make_pool(*equal(3))
    chosen = []
    for _ in range(30):
        route = pool.route(request("t", "the same question"))
        chosen.append(route.members[0])
        route.members[0].began()  # all of them still in flight
        pool.sent(route.members[0], route)
    counts = Counter(member.name for member in chosen)
    assert max(counts.values()) <= 1.25 * 30 / 3 + 1  # bounded: never more than (1 + e) x the mean


def test_rendezvous_moves_only_the_keys_of_a_member_that_leaves() -> None:
    pool = make_pool(*equal(4))
    keys = [f"prompt {index}".encode() for index in range(2_000)]
    before = {key: rendezvous(pool.members, key)[0] for key in keys}
    after = {key: rendezvous(pool.members[:3], key)[0] for key in keys}
    moved = [key for key in keys if before[key] is not after[key]]
    assert moved and all(before[key] is pool.members[3] for key in moved)


def test_weighted_round_robin_interleaves_and_least_loaded_takes_the_idle_member() -> None:
    pool = make_pool(member(3), member(1), routing="round-robin")
    picks = "".join(pool.route(request("t", str(index))).members[0].name[-1] for index in range(8))
    assert picks == "00100010"
    least = make_pool(member(1), member(1), member(1), routing="least-loaded")
    least.members[0].began()
    least.members[2].began()
    assert least.route(request("t", "x")).members[0] is least.members[1]


def test_a_member_that_reports_no_reuse_is_forgotten_as_the_holder_of_that_prefix() -> None:
    pool = make_pool(member(1), member(2), member(3))
    route = pool.route(request("t", "long question"))
    holder = route.members[0]
    pool.sent(holder, route)
    again = pool.route(request("t", "long question", "answer", "follow-up"))
    assert again.prefix_holders == (holder.name,)
    pool.finished(holder, again, prompt_tokens=500, cached_tokens=0)  # it evicted it
    assert pool.route(request("t", "long question", "answer", "follow-up")).prefix_holders == ()


def test_conversations_stay_whole_and_a_handful_of_prompts_spread_evenly() -> None:
    pool = make_pool(*equal(3))
    systems = [f"system prompt {index}: " + "be brief. " * 40 for index in range(6)]
    first_turns = {}
    for system in systems:  # six new prompts, one after another: two per member, not as hashing falls
        route = pool.route(request("t", "first", system=system))
        pool.sent(route.members[0], route)
        first_turns[system] = route.members[0]
    assert sorted(Counter(member.name for member in first_turns.values()).values()) == [2, 2, 2]
    served: Counter[str] = Counter()
    rng = random.Random(0)
    conversations = [(system, number) for number in range(2) for system in systems]
    turns = {index: ["first"] for index in range(len(conversations))}
    homes: dict[int, set[str]] = {index: set() for index in range(len(conversations))}
    for index in rng.sample(range(len(conversations)), len(conversations)) * 3:  # interleaved turns
        system, _ = conversations[index]
        route = pool.route(request("t", *turns[index], system=system))
        pool.sent(route.members[0], route)
        served[route.members[0].name] += 1
        homes[index].add(route.members[0].name)
        turns[index] += ["answer", f"turn {len(turns[index])}"]
    assert all(len(home) == 1 for home in homes.values())  # no conversation moved
    assert max(served.values()) / (sum(served.values()) / 3) <= 1.25
