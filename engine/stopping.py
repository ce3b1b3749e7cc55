"""When a request is finished: a stop token, a stop string in the decoded text, or `max_tokens`.

The checker sees token ids and the text decoded so far; decoding itself (incremental detokenisation) is
the caller's. For streaming it also says how many trailing characters might still become a stop string,
so they are held back rather than sent and then retracted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from engine.sampler import SamplingParams


class FinishReason(Enum):
    STOP = "stop"  # a stop token or stop string (OpenAI's "stop")
    LENGTH = "length"  # max_tokens reached


@dataclass(frozen=True, slots=True)
class Finish:
    reason: FinishReason
    text_end: int | None = None  # a stop string matched: the returned text is text[:text_end]


class StopChecker:
    """Decides after each new token whether one request is done."""

    def __init__(self, params: SamplingParams, eos_token_ids: Iterable[int]) -> None:
        self.params = params
        eos = () if params.ignore_eos else tuple(eos_token_ids)
        self.stop_token_ids = frozenset((*params.stop_token_ids, *eos))
        self.longest_stop = max((len(text) for text in params.stop), default=0)

    def check(self, output_token_ids: Sequence[int], text: str, num_new_chars: int) -> Finish | None:
        """After a token is appended: `text` is all output decoded so far, its last `num_new_chars` new."""
        if output_token_ids and output_token_ids[-1] in self.stop_token_ids:
            return Finish(FinishReason.STOP)
        if self.params.stop:
            # Only a match that ends in the new characters is new; it may start up to longest-1 before them.
            search_from = max(0, len(text) - num_new_chars - self.longest_stop + 1)
            found = [at for stop in self.params.stop if (at := text.find(stop, search_from)) != -1]
            if found:
                return Finish(FinishReason.STOP, text_end=min(found))
        if len(output_token_ids) >= self.params.max_tokens:
            return Finish(FinishReason.LENGTH)
        return None

    def num_held_back_chars(self, text: str) -> int:
        """How many trailing characters of `text` are a proper prefix of some stop string."""
        held = 0
        for stop in self.params.stop:
            for length in range(min(len(stop) - 1, len(text)), held, -1):
                if text.endswith(stop[:length]):
                    held = length
                    break
        return held
