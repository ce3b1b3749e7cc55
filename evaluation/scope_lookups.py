"""What a lookup meets in a populated scope, built from a labelled pairs file.

A pairs file judges one pair at a time: a scope holding only `a`, looked up with `b`. A cache meets more: a
scope holding many stored prompts, where the nearest by cosine is often another question of the same topic
and the stored wording of the same question comes second or third. Here every `a` of a set of pairs is
stored in one scope and every `b` that is not itself stored (a new wording) is looked up; each lookup's
`k` nearest stored prompts are its candidates, labelled by the set's paraphrase groups: a candidate is a
paraphrase of the lookup when positive pairs join the two texts, and a wrong answer otherwise (a stored
prompt that no pair relates to the lookup counts as wrong: the conservative reading of an unlabelled pair).

Used to fit the shipped calibration on lookups as well as on pairs (bench/semantic/bench_rule.py), and by
bench/semantic/bench_rewordings.py, which runs the same lookups through the real cache.

`every_prompt_served` is the harsher layout: every text of a set stored in one scope and each looked up among
all the others, as a busy scope meets a question it has never seen (issue 31's "no hit between different
questions"; bench/semantic/bench_multilingual.py and tests/semantic/rule/test_multilingual_served.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from evaluation.pair_sets import LabelledPair, text_groups


class _Judged(Protocol):
    hit: bool
    score: float


JudgeMany = Callable[[list[tuple[str, str]], list[float]], Sequence[_Judged]]


@dataclass(frozen=True, slots=True)
class ScopeLookup:
    """One new wording looked up in the populated scope: its k nearest stored prompts, nearest first."""

    query: str
    kind: str | None  # the kind of the pair the wording came from
    candidates: tuple[str, ...]
    similarities: tuple[float, ...]
    paraphrase: tuple[bool, ...]  # per candidate: may its answer be served for `query`
    has_paraphrase: bool  # a paraphrase of `query` is stored in the scope (near or not)


@dataclass(frozen=True, slots=True)
class PopulatedScope:
    """Every `a` of the pairs, stored once, and what each new `b` is: the layout of a real scope."""

    stored: tuple[str, ...]
    queries: tuple[LabelledPair, ...]  # one pair per new wording (the first pair it appears in)
    paraphrase_groups: dict[str, str]  # text -> group, over the positive pairs

    def is_paraphrase(self, first: str, second: str) -> bool:
        group = self.paraphrase_groups.get(first)
        return group is not None and group == self.paraphrase_groups.get(second)

    def groups_stored(self) -> set[str]:
        """The paraphrase groups with at least one stored prompt."""
        return {self.paraphrase_groups[text] for text in self.stored if text in self.paraphrase_groups}


def populated_scope(pairs: Sequence[LabelledPair]) -> PopulatedScope:
    """Store every `a`; look up every `b` that is not stored, once (texts compared as written)."""
    stored = tuple(dict.fromkeys(pair.a for pair in pairs))
    stored_set = set(stored)
    queries: dict[str, LabelledPair] = {}
    for pair in pairs:
        if pair.b not in stored_set and pair.b not in queries:
            queries[pair.b] = pair
    groups = text_groups(pair for pair in pairs if pair.label == 1)
    return PopulatedScope(stored, tuple(queries.values()), groups)


def scope_lookups(
    scope: PopulatedScope,
    stored_vectors: npt.NDArray[np.float32],
    query_vectors: npt.NDArray[np.float32],
    k: int,
) -> list[ScopeLookup]:
    """Each query's `k` nearest stored prompts by cosine (unit vectors, exact search, as FAISS flat does)."""
    if stored_vectors.shape[0] != len(scope.stored) or query_vectors.shape[0] != len(scope.queries):
        raise ValueError("one vector per stored prompt and per query")
    similarities = query_vectors @ stored_vectors.T  # (queries, stored)
    nearest = np.argsort(-similarities, axis=1, kind="stable")[:, :k]
    with_paraphrase = scope.groups_stored()
    lookups = []
    for row, pair in enumerate(scope.queries):
        candidates = tuple(scope.stored[column] for column in nearest[row])
        lookups.append(
            ScopeLookup(
                query=pair.b,
                kind=pair.kind,
                candidates=candidates,
                similarities=tuple(float(similarities[row, column]) for column in nearest[row]),
                paraphrase=tuple(scope.is_paraphrase(pair.b, candidate) for candidate in candidates),
                has_paraphrase=scope.paraphrase_groups.get(pair.b) in with_paraphrase,
            )
        )
    return lookups


@dataclass(frozen=True, slots=True)
class ServedPrompt:
    """What one lookup of `every_prompt_served` served: the stored prompt and whether pairs join the two."""

    query: str
    served: str
    paraphrase: bool


def every_prompt_served(
    pairs: Sequence[LabelledPair],
    embed: Callable[[list[str]], npt.NDArray[np.float32]],
    judge_many: JudgeMany,
    k: int,
) -> tuple[int, list[ServedPrompt]]:
    """Every text of `pairs` looked up in a scope holding all the others: its `k` nearest (cosine of `embed`'s
    unit vectors) judged by `judge_many`, the accepted one scored highest served, as the cache serves.
    Returns the lookups made and what each hit served; a served prompt that no positive pair joins to the
    query counts as not a paraphrase (the conservative reading, as above)."""
    groups = text_groups(pair for pair in pairs if pair.label == 1)
    texts = sorted({text for pair in pairs for text in (pair.a, pair.b)})
    if len(texts) < 2:
        return len(texts), []
    vectors = embed(texts)
    similarities = vectors @ vectors.T
    np.fill_diagonal(similarities, -np.inf)
    nearest = np.argsort(-similarities, axis=1, kind="stable")[:, : min(k, len(texts) - 1)]
    width = nearest.shape[1]
    questions = [(texts[row], texts[column]) for row in range(len(texts)) for column in nearest[row]]
    cosines = [float(similarities[row, column]) for row in range(len(texts)) for column in nearest[row]]
    verdicts = judge_many(questions, cosines)
    served: list[ServedPrompt] = []
    for row in range(len(texts)):
        judged = verdicts[row * width : (row + 1) * width]
        hits = [index for index, verdict in enumerate(judged) if verdict.hit]
        if not hits:
            continue
        query, candidate = questions[row * width + max(hits, key=lambda index: judged[index].score)]
        group = groups.get(query)
        served.append(ServedPrompt(query, candidate, group is not None and group == groups.get(candidate)))
    return len(texts), served
