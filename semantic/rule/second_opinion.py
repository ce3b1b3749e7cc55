"""A second opinion for the pairs the English verifier is unsure of: two cross-encoders, one score.

The English verifier (MiniLM, 6 layers) and the multilingual one (multilingual-e5-small, 12 layers, fine-tuned
on other pairs) err on different pairs: averaging their logits ranks the English calibration and test parts
better than either alone (ROC-AUC on the chatbot test part 0.951 and 0.959 alone, 0.965 together; reviewed
Quora 0.820 / 0.829 / 0.845; docs/benchmarks.md, eighth round). The second network costs about twice the
first, so it is asked only where its answer can change a decision:

- the first verifier's logit at or above `sure_logit`: the second is taken to agree (its highest logit);
- below `floor_logit`: the second is taken to refuse (its lowest logit);
- in between: the second scores the pair, and the score is the weighted mean of the two logits.

On the calibration parts the second verifier never refused a pair the first scored at `sure_logit` or more,
and no pair under `floor_logit` reaches the default target's threshold whatever the second says; so the
skipped pairs are decided as if it had run. The score is a deterministic function of the pair, like any
verifier's: the calibration is fitted on it (`SecondOpinionSettings` is recorded in the calibration, with the
second verifier's weights hash) and the rule reads it as one verifier's probability. No model, no threshold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt

from semantic.rule.calibrated_rule import PairScorer
from semantic.rule.calibration import logit_array


@dataclass(frozen=True, slots=True)
class SecondOpinionSettings:
    """When the second verifier is asked and how its logit joins the first's (recorded in the calibration)."""

    sha256: str  # the second verifier's weights (a calibration is fitted for these)
    sure_logit: float = 6.0  # the first's logit at or above which the second is taken to agree
    floor_logit: float = 2.0  # the first's logit below which the second is taken to refuse
    # The second verifier's logits on the English calibration rows span this range (its answers saturate:
    # multilingual-e5's fine-tuned head, 6,923 rows); a skipped pair is read at one end of it.
    logit_range: tuple[float, float] = (-5.26144, 4.70654)
    first_weight: float = 0.5  # the blended logit: first_weight * first + (1 - first_weight) * second

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, payload: Mapping[str, object]) -> SecondOpinionSettings:
        """Read back what `to_json` wrote (a calibration's `second_opinion`); every field is required."""
        low, high = _floats(payload["logit_range"], 2)
        return cls(
            sha256=str(payload["sha256"]),
            sure_logit=_floats(payload["sure_logit"], 1)[0],
            floor_logit=_floats(payload["floor_logit"], 1)[0],
            logit_range=(low, high),
            first_weight=_floats(payload["first_weight"], 1)[0],
        )


class SecondOpinion:
    """A `PairScorer`: the first verifier on every pair, the second only on those it is unsure of."""

    def __init__(self, first: PairScorer, second: PairScorer, settings: SecondOpinionSettings) -> None:
        if not settings.floor_logit <= settings.sure_logit:
            raise ValueError("floor_logit must not exceed sure_logit")
        self.first = first
        self.second = second
        self.settings = settings
        self.asked = 0  # pairs the second verifier scored (bench/semantic/bench_rule.py reports it)

    @property
    def name(self) -> str:
        return f"{self.first.name}+{self.second.name}"

    @property
    def runtime(self) -> object:
        """Where the first verifier runs (what `/healthz` reports; the second's is under `multilingual`)."""
        return getattr(self.first, "runtime", None)

    def probabilities(
        self, pairs: Sequence[tuple[str, str]], batch_size: int = 64
    ) -> npt.NDArray[np.float32]:
        settings = self.settings
        first = logit_array(self.first.probabilities(pairs, batch_size))
        low, high = settings.logit_range
        second = np.where(first >= settings.sure_logit, high, low)
        unsure = np.flatnonzero((first >= settings.floor_logit) & (first < settings.sure_logit))
        if len(unsure):
            asked = self.second.probabilities([pairs[int(index)] for index in unsure], batch_size)
            second[unsure] = np.clip(logit_array(asked), low, high)
            self.asked += len(unsure)
        blended = settings.first_weight * first + (1.0 - settings.first_weight) * second
        return np.asarray(1.0 / (1.0 + np.exp(-blended)), dtype=np.float32)

    def probability(self, query: str, candidate: str) -> float:
        return float(self.probabilities([(query, candidate)])[0])


def _floats(value: object, count: int) -> tuple[float, ...]:
    """`count` numbers from a JSON value (a number, or a list of `count`), else ValueError."""
    values = list(value) if isinstance(value, list | tuple) else [value]
    numbers = [item for item in values if isinstance(item, int | float)]
    if len(values) != count or len(numbers) != count:
        raise ValueError(f"second_opinion: expected {count} number(s), got {value!r}")
    return tuple(float(item) for item in numbers)
