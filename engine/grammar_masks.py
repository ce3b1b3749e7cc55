"""One step's token masks: filled for the constrained rows while the model runs, applied to its logits.

The allowed next tokens of a row depend only on the tokens it has accepted so far, so they can be
computed while the forward pass of the step that will sample them is running: `start()` hands the fill
to a worker thread (the forward pass runs in torch ops that release the GIL, so the two overlap), and
`apply()` waits for it and sets every disallowed logit of those rows to -inf. Rows without a grammar are
never touched, and a step without a constrained row costs one list scan.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from engine.grammar import RequestGrammar, bitmask


class PendingMasks:
    """The masks of one step's constrained rows, being filled."""

    def __init__(self, rows: list[int], mask: torch.Tensor, filled: Future[None]) -> None:
        self.rows = rows
        self._mask = mask  # (R, ceil(vocab / 32)) int32; only `rows` are filled
        self._filled = filled

    def wait(self) -> None:
        """Until the filling thread is done with the grammars' matchers (a matcher is not to be touched,
        forked included, while it computes its mask)."""
        self._filled.result()

    @torch.inference_mode()  # the runner's logits are inference tensors
    def apply(self, logits: torch.Tensor, mask_rows: Sequence[int] | None = None) -> None:
        """(L, vocab) logits, in place: disallowed tokens of the constrained rows to -inf. `mask_rows[i]`:
        the mask row of logits row i (default i; forked choices share their parent's row)."""
        self._filled.result()
        sources = range(logits.shape[0]) if mask_rows is None else mask_rows
        constrained = set(self.rows)
        targets = [row for row, source in enumerate(sources) if source in constrained]
        words = self._mask[[sources[row] for row in targets]]  # (C, W)
        bits = (words.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1  # (C, W, 32)
        allowed = bits.flatten(1)[:, : logits.shape[-1]].bool()  # (C, vocab); bit j of word w is token 32w+j
        logits[targets] = logits[targets].masked_fill(~allowed, float("-inf"))


class MaskFiller:
    """Fills the masks of constrained rows on a thread of its own (started on first use)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._executor: ThreadPoolExecutor | None = None

    def start(self, grammars: Sequence[RequestGrammar | None]) -> PendingMasks | None:
        """Begin filling the masks of the rows that have a grammar; None when no row has one."""
        rows = [row for row, grammar in enumerate(grammars) if grammar is not None]
        if not rows:
            return None
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvgate-grammar")
        mask = bitmask(len(grammars), self.vocab_size)
        constrained = [(row, grammar) for row, grammar in enumerate(grammars) if grammar is not None]
        return PendingMasks(rows, mask, self._executor.submit(_fill, constrained, mask))


def _fill(constrained: list[tuple[int, RequestGrammar]], mask: torch.Tensor) -> None:
    for row, grammar in constrained:
        grammar.fill(mask, row)
