"""Grammar-constrained decoding: a request's grammar spec, compiled once per distinct spec, and the matcher
that follows one request's tokens through it.

A spec is JSON text, so that it crosses the engine process's socket as it is and is compiled here, on the
engine's side: `{"type": "json_object"}` (any JSON object) or `{"type": "json_schema", "schema": {...}}` (a
value valid against the schema). Compiled grammars are kept in an LRU keyed by the spec's text, and each
request gets a copy of the compiled matcher (microseconds; the copies share the lexer's caches). JSON is
generated without free whitespace (", " and ": " between items), so a small model cannot pad an answer with
blanks until `max_tokens`. Schemas are read as OpenAI's strict mode reads them: an object without
`additionalProperties` allows no other properties; keywords a grammar cannot enforce (`uniqueItems`) are
ignored rather than refused.

Built on llguidance (vLLM's "guidance" backend): a self-contained Rust wheel, chosen over xgrammar, which on
x86-64 Linux pulls in triton (~1 GB of GPU compiler this CPU engine never runs). A row's mask takes ~10 µs.
It is imported on the first constrained request only, so an engine that never sees a grammar never loads
it. Masks have one bit per id of the model's logits, which may be more than the tokenizer's ids: the extra
ids are never allowed. Applying the masks to a step's logits is `engine.grammar_masks`'s business.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import llguidance

DEFAULT_CACHE_SIZE = 64  # compiled grammars kept (a tool set or a response schema each)
# Compact JSON with a blank after separators (as json.dumps writes it, and as models have mostly seen it);
# `lenient`: keywords llguidance does not implement are ignored, not refused.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}
# The keywords whose values are schemas, or maps or lists of schemas: where `_closed` looks for objects.
_SUBSCHEMA = ("additionalProperties", "items", "not", "contains", "if", "then", "else")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


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
        """`tokenizer`: a transformers fast tokenizer (read on the first compile)."""

        def read_tokenizer() -> llguidance.LLTokenizer:
            import llguidance.hf

            return llguidance.hf.from_tokenizer(tokenizer)

        self._read_tokenizer: Callable[[], llguidance.LLTokenizer] = read_tokenizer
        self.vocab_size = vocab_size
        """The model's logits width (the tokenizer's vocabulary, perhaps padded)."""
        self.cache_size = cache_size
        self.num_compiles = 0
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()  # matchers at the start

    @classmethod
    def from_vocabulary(
        cls, tokens: Sequence[str], stop_token_ids: Sequence[int], vocab_size: int | None = None
    ) -> GrammarCompiler:
        """A compiler over a plain vocabulary (token id i is the text tokens[i]; the stop tokens are special,
        never text): for tests and tokenizers that are not transformers'."""
        compiler = cls(None, vocab_size or len(tokens))

        def read_tokenizer() -> llguidance.LLTokenizer:
            import llguidance

            vocabulary = _Vocabulary(tokens, stop_token_ids)
            return llguidance.LLTokenizer(
                llguidance.TokenizerWrapper(vocabulary), eos_token=list(stop_token_ids)
            )

        compiler._read_tokenizer = read_tokenizer
        return compiler

    def matcher(self, spec: str) -> RequestGrammar:
        """A fresh matcher for one request. Raises `GrammarError` for a spec that does not compile."""
        compiled = self._compile(spec)
        return RequestGrammar(compiled.deep_copy(), self.vocab_size, self._llguidance_tokenizer().vocab_size)

    def _compile(self, spec: str) -> llguidance.LLMatcher:
        compiled = self._compiled.get(spec)
        if compiled is not None:
            self._compiled.move_to_end(spec)
            return compiled
        import llguidance

        schema = _schema_of(spec)
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS)
        except ValueError as error:
            raise GrammarError(f"the JSON schema cannot be used for constrained decoding: {error}") from error
        # Matchers never raise on a bad grammar: they start in an error state that says why.
        compiled = llguidance.LLMatcher(self._llguidance_tokenizer(), grammar, log_level=0)
        if compiled.is_error():
            raise GrammarError(
                f"the JSON schema cannot be used for constrained decoding: {compiled.get_error()}"
            )
        self.num_compiles += 1
        self._compiled[spec] = compiled
        if len(self._compiled) > self.cache_size:
            self._compiled.popitem(last=False)
        return compiled

    def _llguidance_tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            self._tokenizer = self._read_tokenizer()  # ~0.5 s for a 49k vocabulary, once
        return self._tokenizer


class RequestGrammar:
    """One choice's position in its grammar: which tokens may come next, and whether it is complete."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, tokenizer_vocab_size: int) -> None:
        self._matcher = matcher
        self._sizes = (vocab_size, tokenizer_vocab_size)
        # llguidance writes exactly the tokenizer's words; the model's padded ids beyond them stay cleared.
        self._num_words = (tokenizer_vocab_size + 31) // 32
        self._padded = vocab_size > 32 * self._num_words
        self.complete = False
        """The output is a whole sentence of the grammar and nothing but the end may follow."""

    def fill(self, into: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into row `row` of an (R, ceil(vocab / 32)) int32 bitmask."""
        words = into[row]  # a contiguous row of a contiguous mask
        # Releases the GIL while it computes, so it overlaps the forward pass.
        self._matcher.unsafe_compute_mask_ptr(words.data_ptr(), 4 * self._num_words)
        if self._padded:
            words[self._num_words :] = 0

    def fork(self) -> RequestGrammar:
        """An independent copy at the same position (a request's other choices, forked from it)."""
        copy = RequestGrammar(self._matcher.deep_copy(), *self._sizes)
        copy.complete = self.complete
        return copy

    def advance(self, token_id: int) -> bool:
        """Accept a sampled token; True once the grammar is complete (the request should end here)."""
        if not self._matcher.consume_token(token_id):
            # Only possible if a row was sampled without its mask: end rather than emit what cannot parse.
            self.complete = True
        elif self._matcher.is_stopped():
            # A stop token accepted where the grammar may end, or nothing can follow (a closing brace);
            # not when more could follow (a number's next digit): then the end is one allowed token.
            self.complete = True
        return self.complete


def bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """An (rows, ceil(vocab / 32)) int32 bitmask, every token allowed (-1 is all bits set)."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


class _Vocabulary:
    """What `llguidance.TokenizerWrapper` reads of a plain vocabulary: tokens as bytes (special ones marked
    by a leading 0xFF byte, llguidance's convention), and a greedy longest-match tokenizer."""

    def __init__(self, tokens: Sequence[str], special_token_ids: Sequence[int]) -> None:
        self.eos_token_id = special_token_ids[0] if special_token_ids else None
        self.bos_token_id = None
        self.special_token_ids = list(special_token_ids)
        self.tokens = [
            b"\xff" + token.encode() if index in special_token_ids else token.encode()
            for index, token in enumerate(tokens)
        ]
        self._ids = {token: index for index, token in enumerate(tokens) if index not in special_token_ids}
        self._longest = max(map(len, self._ids), default=1)

    def __call__(self, text: str | bytes) -> list[int]:
        text = text.decode() if isinstance(text, bytes) else text
        ids, start = [], 0
        while start < len(text):
            for end in range(min(len(text), start + self._longest), start, -1):
                if text[start:end] in self._ids:
                    ids.append(self._ids[text[start:end]])
                    start = end
                    break
            else:
                raise ValueError(f"no token for {text[start:]!r}")
        return ids


def _closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that does not say (a copy)."""
    if not isinstance(schema, dict):
        return schema
    closed = dict(schema)
    kind = schema.get("type")
    is_object = "properties" in schema or kind == "object" or (isinstance(kind, list) and "object" in kind)
    if is_object and "additionalProperties" not in schema and "patternProperties" not in schema:
        closed["additionalProperties"] = False
    for key in _SUBSCHEMA:
        if isinstance(schema.get(key), dict):
            closed[key] = _closed(schema[key])
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            closed[key] = {name: _closed(value) for name, value in schema[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            closed[key] = [_closed(value) for value in schema[key]]
    return closed


def _schema_of(spec: str) -> dict[str, Any]:
    """The schema a spec compiles: json_object's is any object (its properties open); a json_schema's
    objects are closed (strict mode)."""
    try:
        data = json.loads(spec)
    except ValueError as error:
        raise GrammarError(f"a grammar spec must be JSON: {error}") from error
    kind = data.get("type") if isinstance(data, dict) else None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema" and isinstance(data.get("schema"), dict):
        return _closed(data["schema"])
    raise GrammarError(
        'a grammar spec is {"type": "json_object"} or {"type": "json_schema", "schema": {...}}'
    )
