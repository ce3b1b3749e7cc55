"""Which member of a pool answers a miss: prefix affinity with bounded load, least-loaded, round-robin.

A policy orders a pool's candidates (the routable members of the request's side) best first; the first
takes the request and the others, in that order, are where it fails over. One policy per pool, chosen
once when the pool is built (SGLang's router does the same), never branched on per request.

**prefix** (`KVGATE_ROUTING=prefix`, the default): the request's prefix chain (prefix_keys.py) is looked
up, longest prefix first, in a table of where each prefix was last sent: the members that computed the
longest known prefix come first (the most recent first), then those holding shorter ones, then the rest
in the order of weighted rendezvous hashing ("highest random weight") of the chain's first link, the
system prompt: every gateway replica, and this one after a restart, ranks members alike for a prompt
without sharing any table, and a member that leaves moves only its own prompts.

Load is bounded as in "consistent hashing with bounded loads" (Mirrokni, Thorup, Zadimoghaddam 2018): a
member above `bound` x its fair share of the requests in flight, or of the last `WINDOW` conversations
started, is passed over for the next in the order, so one hot system prompt spills onto a second member
instead of melting the first. Bounds round up (the paper's ceiling), so a quiet pool is not spread for
want of history. Two refinements, because moving a conversation loses all of its history while moving a
new one loses only its system prompt, once:
  - the window counts conversations, not requests: a request counts where it starts a conversation (or a
    single-turn request), and a member that holds some of a conversation's own turns (past its system
    prompt) keeps its later turns, uncounted, while it is under the in-flight bound; conversations of
    similar lengths then balance requests too, and none is moved to even out a count;
  - a prefix no member holds costs the same anywhere, so it goes to a member at or under its fair share
    (bound 1 instead of `bound`): a handful of system prompts spread evenly, not as hashing falls.
Fair shares follow the members' weights, scaled down during slow start. A backend that reports its reused
tokens and reused none of a prefix the table placed on it has evicted it: the table forgets it there
(`missed`), so the table follows what the servers hold, not only where requests went.

**least-loaded**: fewest requests in flight per unit of weight; ties in turn. **round-robin**: smooth
weighted round-robin (nginx's: each pick adds every member's weight to its credit and takes the member
with the most credit, less the total), so 3:1 weights interleave a a b a, not a a a b.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from typing import Protocol, TypeVar

from gateway.fleet.config import Routing
from gateway.fleet.prefix_keys import PrefixChain

WINDOW = 200  # conversations started that the load bound counts (bench/engine/bench_routing.py's window)
TABLE_SIZE = 100_000  # prefixes remembered (least recently routed forgotten first): ~10 MB
HOLDERS = 4  # members remembered per prefix, most recent first


class Candidate(Protocol):
    """A member as a policy sees it."""

    @property
    def name(self) -> str: ...

    @property
    def weight(self) -> float:
        """Configured weight (what rendezvous hashing reads: stable while a member warms up)."""
        ...

    @property
    def share(self) -> float:
        """Weight now (what the load bounds read: less during slow start)."""
        ...

    @property
    def in_flight(self) -> int: ...


C = TypeVar("C", bound=Candidate)


class RoutingPolicy(Protocol):
    name: Routing

    def order(self, candidates: Sequence[C], chain: PrefixChain) -> list[C]:
        """`candidates` best first (never empty when `candidates` is not)."""
        ...

    def routed(self, member: str, chain: PrefixChain) -> None:
        """A request with `chain` was sent to `member`."""
        ...

    def missed(self, member: str, chain: PrefixChain) -> None:
        """`member` said it reused none of the request's prompt."""
        ...

    def holders(self, chain: PrefixChain) -> list[str]:
        """Who the policy believes holds the longest known prefix of `chain` (empty: it keeps no table)."""
        ...


def make_policy(routing: Routing, load_bound: float) -> RoutingPolicy:
    if routing == "prefix":
        return PrefixAffinity(load_bound)
    if routing == "least-loaded":
        return LeastLoaded()
    return RoundRobin()


class PrefixAffinity:
    """Where each prefix was last sent, rendezvous hashing for new ones, and bounded load."""

    name: Routing = "prefix"

    def __init__(self, load_bound: float = 1.25, window: int = WINDOW, table_size: int = TABLE_SIZE) -> None:
        if load_bound < 1.0:
            raise ValueError("load_bound must be >= 1")
        self.load_bound = load_bound
        self._table: OrderedDict[bytes, list[str]] = OrderedDict()
        self._table_size = table_size
        self._recent: deque[str] = deque(maxlen=window)
        self._recent_counts: Counter[str] = Counter()

    def order(self, candidates: Sequence[C], chain: PrefixChain) -> list[C]:
        by_name = {candidate.name: candidate for candidate in candidates}
        preferred: dict[str, C] = {}
        depth: dict[str, int] = {}  # links of this chain each member holds
        for index in range(len(chain.links) - 1, -1, -1):  # the longest prefix known first
            for name in self._table.get(chain.links[index], ()):
                if name in by_name:
                    preferred.setdefault(name, by_name[name])
                    depth.setdefault(name, index + 1)
        key = chain.links[0] if chain.links else b""
        for candidate in rendezvous(candidates, key):
            preferred.setdefault(candidate.name, candidate)
        ordered = list(preferred.values())
        keeps = {name for name, held in depth.items() if held > chain.shared}  # holds this conversation
        # A prefix no member holds costs the same anywhere: it goes where the load is at most the fair
        # share, so a handful of system prompts spread evenly rather than as hashing happens to fall.
        bound = self.load_bound if depth else 1.0
        chosen = self._first_within_bounds(ordered, keeps, bound)
        return [chosen] + [candidate for candidate in ordered if candidate is not chosen]

    def routed(self, member: str, chain: PrefixChain) -> None:
        continuing = any(member in self._table.get(link, ()) for link in chain.links[chain.shared :])
        if not continuing:  # the window counts conversations started (their turns follow them)
            if len(self._recent) == self._recent.maxlen:
                self._recent_counts[self._recent[0]] -= 1
            self._recent.append(member)
            self._recent_counts[member] += 1
        for link in chain.links:
            holders = self._table.pop(link, [])
            self._table[link] = [member, *[name for name in holders if name != member][: HOLDERS - 1]]
        while len(self._table) > self._table_size:
            self._table.popitem(last=False)

    def missed(self, member: str, chain: PrefixChain) -> None:
        for link in chain.links:
            holders = self._table.get(link)
            if holders is not None and member in holders:
                holders.remove(member)

    def holders(self, chain: PrefixChain) -> list[str]:
        for link in reversed(chain.links):
            if self._table.get(link):
                return list(self._table[link])
        return []

    def _first_within_bounds(self, ordered: list[C], keeps: set[str], recent_bound: float) -> C:
        """The first member under both bounds (the recent-requests one, at `recent_bound`, waived for a
        member that holds this conversation); else the first under the in-flight bound (one always is);
        else the first."""
        total_share = sum(candidate.share for candidate in ordered) or 1.0
        in_flight = sum(candidate.in_flight for candidate in ordered) + 1
        recent = sum(self._recent_counts[candidate.name] for candidate in ordered) + 1
        fallback: C | None = None
        for candidate in ordered:
            fair = candidate.share / total_share
            if candidate.in_flight + 1 > math.ceil(self.load_bound * in_flight * fair):
                continue
            if candidate.name in keeps:
                return candidate
            if self._recent_counts[candidate.name] + 1 <= math.ceil(recent_bound * recent * fair):
                return candidate
            fallback = fallback or candidate
        return fallback or ordered[0]


class _Unlearned:
    """A policy that keeps no table: what requests reach and reuse changes nothing."""

    def routed(self, member: str, chain: PrefixChain) -> None:
        return None

    def missed(self, member: str, chain: PrefixChain) -> None:
        return None

    def holders(self, chain: PrefixChain) -> list[str]:
        return []


class LeastLoaded(_Unlearned):
    """Fewest in flight per unit of weight; ties broken in turn, so idle members share the work."""

    name: Routing = "least-loaded"

    def __init__(self) -> None:
        self._turn = 0

    def order(self, candidates: Sequence[C], chain: PrefixChain) -> list[C]:
        self._turn += 1
        count = len(candidates)
        indexed = sorted(
            range(count),
            key=lambda index: (
                candidates[index].in_flight / max(candidates[index].share, 1e-9),
                (index - self._turn) % count,
            ),
        )
        return [candidates[index] for index in indexed]


class RoundRobin(_Unlearned):
    """Smooth weighted round-robin over whichever members are candidates now."""

    name: Routing = "round-robin"

    def __init__(self) -> None:
        self._credit: dict[str, float] = {}

    def order(self, candidates: Sequence[C], chain: PrefixChain) -> list[C]:
        total = 0.0
        for candidate in candidates:
            self._credit[candidate.name] = self._credit.get(candidate.name, 0.0) + candidate.share
            total += candidate.share
        ordered = sorted(candidates, key=lambda candidate: -self._credit[candidate.name])
        self._credit[ordered[0].name] -= total
        return ordered


def rendezvous(candidates: Sequence[C], key: bytes) -> list[C]:
    """Weighted rendezvous hashing: every candidate scores `weight / -ln(u)`, u a uniform hash of (key,
    name); highest first. A member's keys stay with it whatever others join or leave."""

    def score(candidate: C) -> float:
        digest = hashlib.blake2b(key + candidate.name.encode(), digest_size=8).digest()
        uniform = (int.from_bytes(digest, "big") + 0.5) / 2**64
        return candidate.weight / -math.log(uniform)

    return sorted(candidates, key=score, reverse=True)
