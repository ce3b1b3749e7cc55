"""Log-probabilities of sampled tokens and their most likely alternatives, as OpenAI and vLLM report them.

They are the log-softmax of the model's raw logits for the step: before temperature, top-k / top-p, the
penalties and `logit_bias`, so they describe the model, not the sampling settings. At temperature 0 without
penalties or bias the chosen token is therefore always the first alternative.

The engine turns ids into text (`TokenLogprob.token` is the text the token added to the answer, so the
tokens of an answer join to its text); this module only does the arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

LOGPROB_FLOOR = -9999.0
"""OpenAI's stand-in for a probability of zero (JSON has no -inf)."""


@dataclass(frozen=True, slots=True)
class TopLogprobs:
    """One sampled token's log-probability and the `k` most likely tokens at that step, by id."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    """(token id, logprob) of the most likely tokens, most likely first."""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token of an answer as the API reports it: its text, its log-probability, the alternatives'."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


def top_logprobs(
    logits: torch.Tensor, rows: Sequence[int], token_ids: Sequence[int], num_top: Sequence[int]
) -> list[TopLogprobs]:
    """For each of `rows` of (R, vocab) raw logits: the chosen token's logprob and its row's `num_top` best."""
    if not rows:
        return []
    index = torch.tensor(list(rows), dtype=torch.int64, device=logits.device)
    logprobs = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)  # (len(rows), vocab)
    chosen = torch.tensor(list(token_ids), dtype=torch.int64, device=logits.device)
    chosen_logprobs = logprobs.gather(1, chosen[:, None])[:, 0].clamp(min=LOGPROB_FLOOR).tolist()
    k = max(num_top)
    best_values: list[list[float]] = [[] for _ in rows]
    best_ids: list[list[int]] = [[] for _ in rows]
    if k:
        best = torch.topk(logprobs, k, dim=-1)
        best_values = best.values.clamp(min=LOGPROB_FLOOR).tolist()
        best_ids = best.indices.tolist()
    return [
        TopLogprobs(
            token_id,
            chosen_logprobs[position],
            tuple(zip(best_ids[position][:count], best_values[position][:count], strict=True)),
        )
        for position, (token_id, count) in enumerate(zip(token_ids, num_top, strict=True))
    ]


class PendingLogprobs:
    """One choice's token logprobs, released as the text they spell is: a token whose text is held back (it
    may start a stop string) waits, so the tokens released so far always join to the text released so far."""

    __slots__ = ("_num_chars", "_pending")

    def __init__(self) -> None:
        self._pending: list[TokenLogprob] = []
        self._num_chars = 0  # characters of the answer covered by the released tokens

    def add(self, entry: TokenLogprob) -> None:
        self._pending.append(entry)

    def drop_last(self) -> None:
        """The last token is not part of the answer (a stop token)."""
        self._pending.pop()

    def extend_last(self, text: str) -> None:
        """Text the detokenizer released only at the end belongs to the last token."""
        if text and self._pending:
            last = self._pending[-1]
            self._pending[-1] = TokenLogprob(last.token + text, last.logprob, last.top)

    def release(self, end: int, final: bool = False) -> tuple[TokenLogprob, ...]:
        """The pending tokens whose text lies within the answer's first `end` characters. When `final` the
        answer ends at `end`: a token crossing it is cut there, tokens past it are dropped (a stop string)."""
        released: list[TokenLogprob] = []
        pending = self._pending
        while pending and self._num_chars + len(pending[0].token) <= end:
            entry = pending.pop(0)
            self._num_chars += len(entry.token)
            released.append(entry)
        if final:
            if pending and self._num_chars < end:
                entry = pending[0]
                released.append(TokenLogprob(entry.token[: end - self._num_chars], entry.logprob, entry.top))
                self._num_chars = end
            pending.clear()
        return tuple(released)
