"""Token ids to text, incrementally: what a request's new token adds to its answer.

Byte-level BPE tokens can end in the middle of a UTF-8 character and SentencePiece tokens can change how
the previous one reads, so text is released only once a short window decodes cleanly. The engine keeps one
`IncrementalDetokenizer` per choice; the tokenizer itself is the model's (anything with `decode`).
"""

from __future__ import annotations

from typing import Protocol

_DETOKENIZER_CONTEXT = 5  # prompt tokens decoded before the output, so its first token keeps its space


class Detokenizer(Protocol):
    """The part of a tokenizer the engine uses (transformers tokenizers have it)."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """One request's output tokens to text deltas, decoding only a short window each token.

    A token can end in the middle of a UTF-8 character (byte-level BPE) or change how the previous token
    reads (SentencePiece spaces), so text is released only once the window decodes cleanly."""

    def __init__(self, tokenizer: Detokenizer, prompt_token_ids: list[int]) -> None:
        self._tokenizer = tokenizer
        self._token_ids = list(prompt_token_ids[-_DETOKENIZER_CONTEXT:])
        self._prefix_offset = 0
        self._read_offset = len(self._token_ids)

    def add(self, token_id: int) -> str:
        """Append a token; returns the text it completes ("" while a character is still partial)."""
        self._token_ids.append(token_id)
        prefix_text, full_text = self._decode_window()
        if len(full_text) <= len(prefix_text) or full_text.endswith("\ufffd"):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._token_ids)
        return full_text[len(prefix_text) :]

    def flush(self) -> str:
        """Whatever text is still held back (at the end of a request)."""
        prefix_text, full_text = self._decode_window()
        self._prefix_offset = self._read_offset = len(self._token_ids)
        return full_text[len(prefix_text) :]

    def _decode_window(self) -> tuple[str, str]:
        decode = self._tokenizer.decode
        window = self._token_ids[self._prefix_offset :]
        prefix = self._token_ids[self._prefix_offset : self._read_offset]
        return decode(prefix, skip_special_tokens=True), decode(window, skip_special_tokens=True)
