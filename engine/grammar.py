"""Grammar-constrained decoding: a request's grammar spec, compiled once per distinct spec, and the matcher
that follows one request's tokens through it.

A spec is JSON text, so that it crosses the engine process's socket as it is and is compiled here, on the
engine's side: `{"type": "json_object"}` (any JSON object) or `{"type": "json_schema", "schema": {...}}` (a
value valid against the schema). Compiling is the expensive part (milliseconds to seconds for a large
schema), so compiled grammars are kept in an LRU keyed by the spec's text; a matcher is cheap. JSON is
generated without free whitespace, so a small model cannot pad an answer with blanks until `max_tokens`.

Built on xgrammar (what vLLM and SGLang use): a mask comes from a per-grammar cache of token sets, ~0.1 ms
per row. It is imported on the first constrained request only (its import costs about two seconds), so an
engine that never sees a grammar never pays for it. Masks have one bit per id of the model's logits, which
may be more than the tokenizer's ids: the extra ids are never allowed. Applying the masks to a step's
logits is `engine.grammar_masks`'s business.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    import xgrammar

DEFAULT_CACHE_SIZE = 64  # compiled grammars kept (a tool set or a response schema each)


class GrammarError(ValueError):
    """A grammar spec that is not one kvgate knows, or a schema the compiler refuses."""


def json_object_spec() -> str:
    """The spec of OpenAI's `response_format: {"type": "json_object"}`: any JSON object."""
    return json.dumps({"type": "json_object"})


def json_schema_spec(schema: dict[str, Any]) -> str:
    """The spec of a JSON schema (`response_format` `json_schema`, or a tool call's schema). Key order is
    kept: it is the order the properties are generated in."""
    return json.dumps({"type": "json_schema", "schema": schema})


class GrammarCompiler:
    """Compiles specs for one tokenizer and vocabulary, caching the compiled grammars by spec text."""

    def __init__(self, tokenizer: Any, vocab_size: int, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        """`tokenizer`: a transformers tokenizer (read on the first compile)."""

        def tokenizer_info() -> xgrammar.TokenizerInfo:
            import xgrammar

            return xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)

        self._tokenizer_info: Callable[[], xgrammar.TokenizerInfo] = tokenizer_info
        self.vocab_size = vocab_size
        """The model's logits width (the tokenizer's vocabulary, perhaps padded)."""
        self.cache_size = cache_size
        self.num_compiles = 0
        self._compiler: xgrammar.GrammarCompiler | None = None
        self._stop_token_ids: tuple[int, ...] = ()
        self._compiled: OrderedDict[str, xgrammar.CompiledGrammar] = OrderedDict()

    @classmethod
    def from_vocabulary(
        cls, tokens: Sequence[str], stop_token_ids: Sequence[int], vocab_size: int | None = None
    ) -> GrammarCompiler:
        """A compiler over a plain vocabulary (token id i is the text tokens[i]): for tests and tokenizers
        that are not transformers'."""
        compiler = cls(None, vocab_size or len(tokens))

        def tokenizer_info() -> xgrammar.TokenizerInfo:
            import xgrammar

            return xgrammar.TokenizerInfo(
                list(tokens), vocab_size=compiler.vocab_size, stop_token_ids=list(stop_token_ids)
            )

        compiler._tokenizer_info = tokenizer_info
        return compiler

    def matcher(self, spec: str) -> RequestGrammar:
        """A fresh matcher for one request. Raises `GrammarError` for a spec that does not compile."""
        import xgrammar

        compiled = self._compile(spec)
        return RequestGrammar(xgrammar.GrammarMatcher(compiled), self.vocab_size, self._stop_token_ids)

    def _compile(self, spec: str) -> xgrammar.CompiledGrammar:
        compiled = self._compiled.get(spec)
        if compiled is not None:
            self._compiled.move_to_end(spec)
            return compiled
        compiler = self._xgrammar_compiler()
        kind, schema = _parse_spec(spec)
        try:
            if kind == "json_object":
                # Not strict: an object with any properties (strict mode would allow only `{}`).
                compiled = compiler.compile_json_schema(
                    '{"type": "object"}', any_whitespace=False, strict_mode=False
                )
            else:
                compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        except (RuntimeError, ValueError, TypeError) as error:
            raise GrammarError(f"the JSON schema cannot be used for constrained decoding: {error}") from error
        self.num_compiles += 1
        self._compiled[spec] = compiled
        if len(self._compiled) > self.cache_size:
            self._compiled.popitem(last=False)
        return compiled

    def _xgrammar_compiler(self) -> xgrammar.GrammarCompiler:
        if self._compiler is None:
            import xgrammar

            info = self._tokenizer_info()
            self._stop_token_ids = tuple(info.stop_token_ids)
            # One compile thread: the engine's step loop owns the CPU; compiles are rare thanks to the cache.
            self._compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        return self._compiler


class RequestGrammar:
    """One request's position in its grammar: which tokens may come next, and whether it is complete."""

    def __init__(
        self, matcher: xgrammar.GrammarMatcher, vocab_size: int, stop_token_ids: tuple[int, ...]
    ) -> None:
        self._matcher = matcher
        self._stop_token_ids = stop_token_ids
        self._scratch = bitmask(1, vocab_size)
        self.complete = False
        """The output is a whole sentence of the grammar and nothing but the end may follow."""

    def fill(self, into: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into row `row` of an (R, ceil(vocab / 32)) int32 bitmask."""
        self._matcher.fill_next_token_bitmask(into, row)

    def advance(self, token_id: int) -> bool:
        """Accept a sampled token; True once the grammar is complete (the request should end here)."""
        if not self._matcher.accept_token(token_id):
            # Only possible if a row was sampled without its mask: end rather than emit what cannot parse.
            self.complete = True
        elif self._matcher.is_terminated():
            self.complete = True  # a stop token, accepted where the grammar may end
        elif self._matcher.is_completed():
            # The grammar may end here; end now unless more could follow (a number's next digit).
            self._matcher.fill_next_token_bitmask(self._scratch, 0)
            self.complete = _only_tokens_allowed(self._scratch[0], self._stop_token_ids)
        return self.complete


def bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """An (rows, ceil(vocab / 32)) int32 bitmask, every token allowed (-1 is all bits set)."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def _only_tokens_allowed(mask_row: torch.Tensor, token_ids: tuple[int, ...]) -> bool:
    words = mask_row.numpy().view(np.uint32).copy()
    for token_id in token_ids:
        words[token_id >> 5] &= ~np.uint32(1 << (token_id & 31))
    return not words.any()


def _parse_spec(spec: str) -> tuple[str, dict[str, Any] | None]:
    try:
        data = json.loads(spec)
    except ValueError as error:
        raise GrammarError(f"a grammar spec must be JSON: {error}") from error
    kind = data.get("type") if isinstance(data, dict) else None
    if kind == "json_object":
        return kind, None
    if kind == "json_schema" and isinstance(data.get("schema"), dict):
        return kind, data["schema"]
    raise GrammarError(
        'a grammar spec is {"type": "json_object"} or {"type": "json_schema", "schema": {...}}'
    )
