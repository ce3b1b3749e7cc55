"""Grammar-constrained decoding over a toy character vocabulary: the masks, the matcher, completion, the
compile cache, and the engine ending a constrained request where its JSON ends."""

from __future__ import annotations

import json

import pytest
import torch

from engine.engine import LLMEngine
from engine.engine_config import EngineConfig
from engine.grammar import GrammarCompiler, GrammarError, bitmask, json_object_spec, json_schema_spec
from engine.grammar_masks import MaskFiller
from engine.sampler import RequestSampler, SamplingParams, sample_batch
from tests.engine.llama_testing import make_engine_model, make_hf_llama

# One character per token; id 0 is the end of text. Padded logits: 8 ids the tokenizer does not have.
VOCAB = ["</s>", "{", "}", '"', ":", ",", " ", "a", "b", "x", "1", "2", "[", "]", "t", "r", "u", "e"]
EOS = 0
PADDED = len(VOCAB) + 8
SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


@pytest.fixture
def compiler() -> GrammarCompiler:
    return GrammarCompiler.from_vocabulary(VOCAB, [EOS], vocab_size=PADDED)


def ids(text: str) -> list[int]:
    return [VOCAB.index(char) for char in text]


def allowed(compiler: GrammarCompiler, prefix: str, spec: str) -> set[str]:
    """The characters a mask allows after `prefix`, read back from masked logits."""
    grammar = compiler.matcher(spec)
    for token in ids(prefix):
        assert not grammar.advance(token)
    pending = MaskFiller(PADDED).start([grammar])
    assert pending is not None
    logits = torch.zeros(1, PADDED)
    pending.apply(logits)
    return {VOCAB[token] for token in torch.isfinite(logits[0]).nonzero().flatten().tolist()}


def test_the_mask_allows_only_what_the_schema_allows_next(compiler: GrammarCompiler) -> None:
    spec = json_schema_spec(SCHEMA)
    assert allowed(compiler, "", spec) == {"{"}
    assert allowed(compiler, '{"a": ', spec) == {"1", "2"}  # an integer: digits (no "-" in this vocabulary)
    assert allowed(compiler, '{"a": 1, "b": ', spec) == {"t"}  # "true"; "false" needs letters we lack
    assert allowed(compiler, '{"a": 1, "b": true', spec) == {"}"}


def test_padded_ids_beyond_the_tokenizer_are_never_allowed(compiler: GrammarCompiler) -> None:
    grammar = compiler.matcher(json_object_spec())
    pending = MaskFiller(PADDED).start([grammar])
    assert pending is not None
    logits = torch.zeros(1, PADDED)
    pending.apply(logits)
    assert not torch.isfinite(logits[0, len(VOCAB) :]).any()


def test_padding_of_whole_words_beyond_the_tokenizer_is_never_allowed() -> None:
    """Logits 40 ids wider than the tokenizer: the mask's second word is the model's alone."""
    wide = len(VOCAB) + 40
    grammar = GrammarCompiler.from_vocabulary(VOCAB, [EOS], vocab_size=wide).matcher(json_object_spec())
    pending = MaskFiller(wide).start([grammar])
    assert pending is not None
    logits = torch.zeros(1, wide)
    pending.apply(logits)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [VOCAB.index("{")]


def test_a_schema_object_allows_no_other_properties_unless_it_says(compiler: GrammarCompiler) -> None:
    """OpenAI's strict mode: properties not listed are refused; json_object's properties stay open."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert allowed(compiler, '{"a": 1', json_schema_spec(schema)) == {"1", "2", "}"}
    opened = {**schema, "additionalProperties": True}
    assert "," in allowed(compiler, '{"a": 1', json_schema_spec(opened))
    assert "," in allowed(compiler, '{"a": 1', json_object_spec())


def test_keywords_the_grammar_cannot_enforce_are_ignored(compiler: GrammarCompiler) -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    assert allowed(compiler, "[1, ", json_schema_spec(schema)) == {"1", "2"}


def test_rows_without_a_grammar_are_untouched(compiler: GrammarCompiler) -> None:
    filler = MaskFiller(PADDED)
    assert filler.start([None, None]) is None
    pending = filler.start([None, compiler.matcher(json_object_spec()), None])
    assert pending is not None
    logits = torch.randn(3, PADDED)
    before = logits.clone()
    pending.apply(logits)
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    assert torch.isfinite(logits[1]).sum() == 1  # only "{" may open an object


def test_masked_sampling_follows_the_grammar_whatever_the_model_prefers(compiler: GrammarCompiler) -> None:
    """Logits that prefer the end of text and then "x" everywhere: the output is still the schema's."""
    grammar = compiler.matcher(json_schema_spec(SCHEMA))
    sampler = SamplingParams(temperature=0.0)
    text, filler, done = "", MaskFiller(PADDED), False
    while not done and len(text) < 40:
        logits = torch.arange(PADDED, dtype=torch.float32).flip(0).unsqueeze(0)  # id 0 (eos) most likely
        logits[0, VOCAB.index("x")] = 100.0
        pending = filler.start([grammar])
        assert pending is not None
        pending.apply(logits)
        (token,) = sample_batch(logits, [RequestSampler(sampler)])
        text += VOCAB[token]
        done = grammar.advance(token)
    assert done and json.loads(text) == {"a": 1, "b": True}  # lowest allowed ids first: "1", then ","


def test_completion_ends_at_the_last_brace_not_before(compiler: GrammarCompiler) -> None:
    grammar = compiler.matcher(json_object_spec())
    advanced = [grammar.advance(token) for token in ids('{"a": [1, 2]}')]
    assert advanced == [False] * 12 + [True] and grammar.complete


def test_a_number_that_could_go_on_is_not_complete_yet(compiler: GrammarCompiler) -> None:
    grammar = compiler.matcher(json_schema_spec({"type": "integer"}))
    assert grammar.advance(ids("1")[0]) is False  # "12" is still possible
    assert grammar.advance(EOS) is True  # the end is allowed, and ends it


def test_compiled_grammars_are_cached_by_spec(compiler: GrammarCompiler) -> None:
    spec = json_schema_spec(SCHEMA)
    compiler.matcher(spec)
    compiler.matcher(spec)
    compiler.matcher(json_object_spec())
    assert compiler.num_compiles == 2
    small = GrammarCompiler.from_vocabulary(VOCAB, [EOS], vocab_size=PADDED)
    small.cache_size = 1
    small.matcher(spec)
    small.matcher(json_object_spec())  # evicts the schema
    small.matcher(spec)
    assert small.num_compiles == 3


@pytest.mark.parametrize(
    "spec", ["not json", '{"type": "regex"}', json_schema_spec({"type": "no-such-type"})]
)
def test_a_spec_that_cannot_compile_is_a_grammar_error(compiler: GrammarCompiler, spec: str) -> None:
    with pytest.raises(GrammarError):
        compiler.matcher(spec)


def test_bitmask_starts_with_every_token_allowed() -> None:
    mask = bitmask(2, 40)
    assert mask.shape == (2, 2) and (mask == -1).all()


def test_the_engine_ends_a_constrained_request_where_its_json_ends() -> None:
    """A random tiny model under a json_object grammar: the text parses, and the request ends with "stop"
    at the closing brace rather than running to max_tokens; a free request beside it is unchanged."""
    model = make_engine_model(make_hf_llama(vocab_size=PADDED))
    tokenizer = _CharTokenizer()
    engine = LLMEngine(model, tokenizer, EngineConfig(num_blocks=64, block_size=4))
    engine.grammars = GrammarCompiler.from_vocabulary(VOCAB, [EOS], vocab_size=PADDED)
    free = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    reference = engine.generate([[1, 2, 3]], free)[0]
    engine.add_request(
        "json", [1, 2, 3], SamplingParams(temperature=1.0, seed=3, max_tokens=200, grammar=json_object_spec())
    )
    engine.add_request("free", [1, 2, 3], free)
    tokens: dict[str, list[int]] = {"json": [], "free": []}
    reasons: dict[str, str | None] = {}
    while engine.has_unfinished():
        for output in engine.step():
            tokens[output.request_id] += output.token_ids
            if output.finish_reason is not None:
                reasons[output.request_id] = output.finish_reason
    text = "".join(VOCAB[token] for token in tokens["json"])
    assert isinstance(json.loads(text), dict) and reasons["json"] == "stop"
    assert tokens["free"] == reference and reasons["free"] == "length"


def test_forked_choices_each_follow_the_grammar_with_logprobs_penalties_and_bias() -> None:
    """n=3 under a schema: each choice has its own matcher (a shared one would see three tokens a step and
    break), a +100 bias on a token the grammar never allows cannot get it chosen, and logprobs still come."""
    model = make_engine_model(make_hf_llama(vocab_size=PADDED))
    engine = LLMEngine(model, _CharTokenizer(), EngineConfig(num_blocks=64, block_size=4))
    engine.grammars = GrammarCompiler.from_vocabulary(VOCAB, [EOS], vocab_size=PADDED)
    engine.eos_token_ids = (EOS,)  # the toy model's config says 2, which is "}" here
    sampling = SamplingParams(
        temperature=1.0,
        seed=5,
        max_tokens=60,
        n=3,
        logprobs=2,
        frequency_penalty=1.0,
        logit_bias=((VOCAB.index("x"), 100.0),),
        grammar=json_schema_spec(SCHEMA),
    )
    engine.add_request("json", [1, 2, 3], sampling)
    texts, spelled = ["", "", ""], ["", "", ""]
    reasons: dict[int, str | None] = {}
    while engine.has_unfinished():
        for output in engine.step():
            texts[output.index] += output.text
            spelled[output.index] += "".join(entry.token for entry in output.logprobs)
            if output.finish_reason is not None:
                reasons[output.index] = output.finish_reason
    for index, text in enumerate(texts):
        assert reasons[index] == "stop" and "x" not in text and spelled[index] == text
        value = json.loads(text)
        assert set(value) == {"a", "b"} and isinstance(value["a"], int) and isinstance(value["b"], bool)


class _CharTokenizer:
    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(VOCAB[token] if token < len(VOCAB) else "?" for token in token_ids if token != EOS)
